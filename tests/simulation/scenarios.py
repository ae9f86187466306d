"""Simulated runs of the replicating client: a `Plan` (seed, quorums, nodes, load,
racing recoveries, readers, a fault schedule) run by `run_plan` under `SimTime`,
every client event recorded in a `History` that checks the invariants as it goes.

A run: one writer appends from many tasks; recoveries start at planned times and
race it and each other; readers read below the LAC and a follower tails; faults
come and go on schedule. Then the network heals, every crashed node restarts, and
an auditor recovers the ledger, reads it back whole, and checks each entry on every
replica of its write set (R20)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

from journal.errors import PoraError
from ledger.errors import NoSuchEntry, NoSuchLedger
from pora import Client, ClientConfig, LedgerFenced, LedgerWriter
from pora.client.channel import LocalChannel
from pora.client.replication.client import client_on_store
from pora.client.replication.entry_format import decode_entry
from pora.client.replication.quorum import entry_write_set
from pora.meta.records import LedgerMetadata, LedgerState
from pora.meta.store import MetadataStore, open_metadata
from simulation import invariants
from simulation.clock import SimTime, counted_threads, counting_store, tasks_in_order
from simulation.cluster import SimCluster, sim_cluster
from simulation.history import History
from simulation.network import LinkFaults, SimNetwork

PASSWORD = "sim"
WRITER = "writer"

#: failure detection in simulated seconds: a run of many timeouts costs no real time
SIM_CONFIG = ClientConfig(
    node_timeout_s=0.5,
    connect_timeout_s=0.5,
    ensemble_change_timeout_s=2.0,
    lac_flush_interval_s=0.05,
    speculative_read_delay_s=0.02,
    tail_poll_wait_s=0.3,
    recovery_fence_timeout_s=2.0,
)


@dataclass(frozen=True)
class Fault:
    """At `at_s`, `kind` hits node `node` (an index into the addresses) for `for_s`:
    crash (restarted after, same data dir), partition (from `client`), slow (its
    messages take `factor` times longer), wipe (back at once on an empty data dir),
    pause (`client`'s messages are held, as a process stopped by SIGSTOP)."""

    at_s: float
    kind: str
    node: int
    for_s: float = 0.5
    client: str = WRITER
    factor: float = 100.0


@dataclass(frozen=True)
class Plan:
    seed: int
    nodes: int = 4
    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    appenders: int = 6
    appends_each: int = 5
    #: start times of recoveries racing the writer (and each other)
    recoveries: tuple[float, ...] = (0.05,)
    readers: int = 1
    tail: bool = True
    faults: tuple[Fault, ...] = ()
    drop_rate: float = 0.0
    #: the writer closes its ledger once its appenders are done (if not fenced)
    close_writer: bool = True
    #: every member of a recovered entry's write set holds it, whether or not it
    #: answered the recovery (true only when no fault hides a member from it)
    strict_recovery_copies: bool = False
    #: the writer's pause between two appends of one task, at most (simulated s)
    append_pause_s: float = 0.05


@dataclass
class RunResult:
    history: History
    ledger_id: int
    closed: tuple[int, int]
    delivered: dict[str, int] = field(default_factory=dict)
    dropped: int = 0


def run_plan(plan: Plan, folder: Path) -> RunResult:
    """Run `plan` to its end in simulated time (data dirs under `folder`)."""
    sim = SimTime()
    results: list[RunResult] = []

    async def main() -> None:
        with counted_threads(sim):
            async with trio.open_nursery() as outer:
                outer.start_soon(sim.drive)
                async with open_metadata(f"sqlite:///{folder}/meta.db") as raw:
                    store = counting_store(raw, sim, plan.seed)
                    async with sim_cluster(store, folder / "nodes", plan.nodes) as cluster:
                        run = Simulation(plan, store, cluster)
                        results.append(await run.run())
                outer.cancel_scope.cancel()

    with tasks_in_order():
        trio.run(main, clock=sim.clock)
    return results[0]


@asynccontextmanager
async def sim_client(store: MetadataStore, network: SimNetwork, name: str) -> AsyncIterator[Client]:
    """A `pora.Client` named `name` on the simulated network (as `pora.connect`
    builds one, on the simulation's store and channels)."""
    rng = random.Random(f"{network.seed}/{name}")
    async with client_on_store(store, network.opener(name), SIM_CONFIG, rng) as client:
        yield client


def payload_for(appender: int, k: int) -> bytes:
    return f"a{appender}-k{k}|".encode() * (1 + (appender + k) % 4)


class Simulation:
    def __init__(self, plan: Plan, store: MetadataStore, cluster: SimCluster) -> None:
        self.plan = plan
        self.store = store
        self.cluster = cluster
        self.history = History(plan.seed)
        faults = LinkFaults(drop_rate=plan.drop_rate)
        self.network = SimNetwork(cluster, plan.seed, faults, self.history)
        self.rng = random.Random(f"{plan.seed}/plan")
        self.ledger_id = -1

    async def run(self) -> RunResult:
        plan, history = self.plan, self.history
        async with sim_client(self.store, self.network, WRITER) as client:
            writer = await client.create_ledger(
                plan.ensemble, plan.write_quorum, plan.ack_quorum, password=PASSWORD
            )
            self.ledger_id = writer.ledger_id
            members = [m.address for m in writer.metadata.ensembles[0].members]
            history.note(f"created ledger {self.ledger_id} on {members}")
            async with trio.open_nursery() as background:
                background.start_soon(self._faults)
                for k in range(plan.readers):
                    background.start_soon(self._reader, f"reader-{k}")
                if plan.tail:
                    background.start_soon(self._tailer)
                async with trio.open_nursery() as racing:
                    for k, at_s in enumerate(plan.recoveries):
                        racing.start_soon(self._recovery, f"recovery-{k}", at_s)
                    await self._write(writer)
                background.cancel_scope.cancel()
        return await self._audit()

    async def _write(self, writer: LedgerWriter) -> None:
        async with trio.open_nursery() as appenders:
            for k in range(self.plan.appenders):
                appenders.start_soon(self._appender, writer, k)
        if not self.plan.close_writer or WRITER in self.history.fenced_at:
            return
        try:
            await writer.close()
        except LedgerFenced:
            self.history.fenced(WRITER, writer.last_add_confirmed)
        except PoraError as error:
            self.history.failed(f"{WRITER} close", error)
        else:
            meta = writer.metadata
            self.history.closed_at(WRITER, self.ledger_id, meta.last_entry_id, meta.length)

    async def _appender(self, writer: LedgerWriter, appender: int) -> None:
        history = self.history
        rng = random.Random(f"{self.plan.seed}/appender/{appender}")
        for k in range(self.plan.appends_each):
            payload = payload_for(appender, k)
            started = history.note(f"{WRITER} append a{appender}-k{k}")
            try:
                entry_id = await writer.append(payload)
            except LedgerFenced:
                history.fenced(WRITER, writer.last_add_confirmed)
                return
            except PoraError as error:
                history.failed(f"{WRITER} a{appender}-k{k}", error)
                return
            history.acknowledged(WRITER, self.ledger_id, entry_id, payload, started)
            invariants.check_fence(history, WRITER, writer.last_add_confirmed)
            await trio.sleep(rng.uniform(0.0, self.plan.append_pause_s))

    async def _recovery(self, name: str, at_s: float) -> None:
        await trio.sleep(at_s)
        history = self.history
        history.note(f"{name} starts")
        async with sim_client(self.store, self.network, name) as client:
            try:
                reader = await client.open_ledger(self.ledger_id, PASSWORD)
            except PoraError as error:
                history.failed(name, error)
                return
            history.closed_at(name, self.ledger_id, reader.last_entry_id, reader.metadata.length)
            try:
                async for entry_id, data in reader.read_entries(0, reader.last_entry_id):
                    history.read(name, self.ledger_id, entry_id, data)
            except PoraError as error:
                history.failed(f"{name} read", error)

    async def _reader(self, name: str) -> None:
        """Reads ids at or below the LAC it learns, of the open ledger (R23)."""
        history = self.history
        rng = random.Random(f"{self.plan.seed}/{name}")
        async with sim_client(self.store, self.network, name) as client:
            reader = None
            while reader is None:
                try:
                    reader = await client.open_ledger(self.ledger_id, PASSWORD, recover=False)
                except PoraError as error:
                    history.failed(name, error)
                    await trio.sleep(0.05)
            while True:
                await trio.sleep(rng.uniform(0.005, 0.05))
                try:
                    lac = await reader.refresh_last_add_confirmed()
                    if lac < 0:
                        continue
                    entry_id = rng.randint(0, lac)
                    data = await reader.read(entry_id)
                except PoraError as error:
                    history.failed(name, error)
                    continue
                history.read(name, self.ledger_id, entry_id, data)
                if reader.closed:
                    history.closed_at(
                        name, self.ledger_id, reader.last_entry_id, reader.metadata.length
                    )

    async def _tailer(self) -> None:
        history = self.history
        async with sim_client(self.store, self.network, "tail") as client:
            try:
                follower = await client.open_ledger(self.ledger_id, PASSWORD, recover=False)
                async for entry_id, data in follower.tail(0):
                    history.read("tail", self.ledger_id, entry_id, data)
            except PoraError as error:
                history.failed("tail", error)

    async def _faults(self) -> None:
        async with trio.open_nursery() as undo:
            started = trio.current_time()
            for fault in sorted(self.plan.faults, key=lambda f: f.at_s):
                await trio.sleep_until(started + fault.at_s)
                await self._apply(fault, undo)

    async def _apply(self, fault: Fault, undo: trio.Nursery) -> None:
        address = self.cluster.addresses[fault.node % len(self.cluster.addresses)]
        network, cluster = self.network, self.cluster
        self.history.note(f"fault {fault.kind} {address} for {fault.for_s} s")
        if fault.kind == "crash":
            await cluster.crash(address)
            undo.start_soon(self._later, fault.for_s, cluster.restart, address)
        elif fault.kind == "wipe":
            await cluster.wipe(address)
        elif fault.kind == "partition":
            network.partition(fault.client, address)

            async def heal(address: str) -> None:
                network.heal(fault.client, address)

            undo.start_soon(self._later, fault.for_s, heal, address)
        elif fault.kind == "pause":
            network.pause(fault.client)

            async def resume(address: str) -> None:
                network.resume(fault.client)

            undo.start_soon(self._later, fault.for_s, resume, address)
        elif fault.kind == "slow":
            network.faults.slowdown[address] = fault.factor

            async def speed_up(address: str) -> None:
                network.faults.slowdown.pop(address, None)

            undo.start_soon(self._later, fault.for_s, speed_up, address)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    async def _later(
        self, delay_s: float, action: Callable[[str], Awaitable[None]], address: str
    ) -> None:
        await trio.sleep(delay_s)
        self.history.note(f"undo {action.__name__} {address}")
        await action(address)

    async def _audit(self) -> RunResult:
        """Heal everything, recover the ledger, read it back whole, check replicas."""
        history, network = self.history, self.network
        network.heal_all()
        for address in self.cluster.addresses:
            await self.cluster.restart(address)
        history.note("healed: every node up, every link mended")
        async with sim_client(self.store, network, "auditor") as client:
            reader = await client.open_ledger(self.ledger_id, PASSWORD)
            meta = reader.metadata
            history.closed_at("auditor", self.ledger_id, meta.last_entry_id, meta.length)
            entries: dict[int, bytes] = {}
            async for entry_id, data in reader.read_entries(0, meta.last_entry_id):
                history.read("auditor", self.ledger_id, entry_id, data)
                entries[entry_id] = data
        invariants.check_read_back(history, self.ledger_id, entries)
        await self._check_replicas(meta, entries)
        return RunResult(
            history,
            self.ledger_id,
            (meta.last_entry_id, meta.length),
            dict(network.delivered),
            network.dropped,
        )

    async def _check_replicas(self, meta: LedgerMetadata, entries: dict[int, bytes]) -> None:
        """Each entry on its write set, straight from the nodes' stores: the same bytes
        wherever it is; at least Qa copies (less the members wiped since); every
        member that took a recovery's add of it still holds it (R20)."""
        history = self.history
        assert meta.state is LedgerState.CLOSED
        for entry_id in range(meta.last_entry_id + 1):
            holders = 0
            wiped = 0
            for member in entry_write_set(meta, entry_id):
                if self.cluster.instance_id(member.address) != member.instance_id:
                    wiped += 1
                    continue
                channel = LocalChannel(self.cluster.nodes[member.address], member.address)
                try:
                    stored, _ = await channel.read_entry(self.ledger_id, entry_id)
                except (NoSuchEntry, NoSuchLedger):  # the node never got one of its entries
                    took = history.recovery_adds.get((self.ledger_id, entry_id), set())
                    if member.address in took or (took and self.plan.strict_recovery_copies):
                        invariants.fail(
                            history,
                            f"R20: entry {entry_id} of ledger {self.ledger_id} is missing on "
                            f"{member.address}, a member of its write set that took it from "
                            "a recovery (or should have)",
                        )
                    continue
                decoded = decode_entry(self.ledger_id, entry_id, stored)
                if bytes(decoded.payload) != entries[entry_id]:
                    invariants.fail(
                        history,
                        f"entry {entry_id} of ledger {self.ledger_id} on {member.address} "
                        "differs from what readers read",
                    )
                holders += 1
            if holders < meta.ack_quorum - wiped:
                invariants.fail(
                    history,
                    f"entry {entry_id} of ledger {self.ledger_id} has {holders} copies on its "
                    f"write set, fewer than Qa={meta.ack_quorum} ({wiped} member(s) wiped)",
                )


def plan_from_seed(seed: int) -> Plan:
    """The whole plan drawn from the seed alone, so a seed names a run: quorums, node
    count, load, racing recoveries, and up to three faults (at most one wipe, and
    only with Qa >= 2: a wiped node loses its copies, and an entry acknowledged on Qa
    nodes survives the loss of Qa - 1)."""
    rng = random.Random(seed)
    ensemble = rng.randint(2, 4)
    write_quorum = rng.randint(max(1, ensemble - 1), ensemble)
    ack_quorum = rng.randint(1, write_quorum)
    nodes = ensemble + rng.randint(0, 2)
    faults: list[Fault] = []
    wiped = False
    for _ in range(rng.randint(0, 3)):
        kind = rng.choice(["crash", "partition", "slow", "pause", "wipe"])
        if kind == "wipe" and (wiped or ack_quorum < 2):
            kind = "crash"
        wiped = wiped or kind == "wipe"
        faults.append(
            Fault(
                at_s=round(rng.uniform(0.0, 0.3), 4),
                kind=kind,
                node=rng.randrange(nodes),
                for_s=round(rng.uniform(0.05, 1.0), 3),
                client=rng.choice([WRITER, WRITER, "recovery-0", "reader-0"]),
                factor=rng.choice([10.0, 100.0, 300.0]),
            )
        )
    if wiped:
        # a recovery re-adds to a wiped member's replacement: never the wiped node
        # itself (R9 excludes an address that failed for the ledger)
        nodes = max(nodes, ensemble + 1)
    recoveries = tuple(round(rng.uniform(0.0, 0.4), 4) for _ in range(rng.randint(0, 2)))
    return Plan(
        seed=seed,
        nodes=nodes,
        ensemble=ensemble,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        appenders=rng.randint(1, 8),
        appends_each=rng.randint(3, 8),
        recoveries=recoveries,
        readers=rng.randint(0, 2),
        tail=rng.random() < 0.5,
        faults=tuple(faults),
        drop_rate=rng.choice([0.0, 0.0, 0.005, 0.02]),
        close_writer=rng.random() < 0.7,
    )
