"""Simulated runs of the replicating client: a `Plan` (plans.py: seed, quorums, nodes, load,
racing recoveries, readers, a fault schedule) run by `run_plan` under `SimTime`,
every client event recorded in a `History` that checks the invariants as it goes.
Clients reach the nodes through the real per-node client and server (network.py),
and the nodes' journals and entry logs sit on a disk that fails and forgets
(disk.py): a crash loses what was not synced; ENOSPC and EIO come and go.

A run: one writer appends from many tasks; recoveries start at planned times and
race it and each other; a delete may too (R26); readers read below the LAC and a
follower tails; faults come and go on schedule. Then the network heals, every crashed
node restarts, and an auditor recovers the ledger, reads it back whole, and checks
each entry on every replica of its write set (R20); or, when the delete went
through, checks that the ledger is gone (NoSuchLedger)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from errno import EIO, ENOSPC
from pathlib import Path
from typing import Any, TypeVar, cast

import trio

from journal.errors import PoraError
from journal.fileio import use_file_calls
from ledger.errors import NoSuchEntry, NoSuchLedger
from pora import Client, ClientConfig, LedgerFenced, LedgerWriter
from pora.client.batch import Batch
from pora.client.local_channel import LocalChannel
from pora.client.node_calls import NodeCaller
from pora.client.replication.client import client_on_store
from pora.client.replication.core.entry_format import decode_entry
from pora.client.replication.core.quorum import entry_write_set
from pora.meta.backends import open_metadata
from pora.meta.errors import NoSuchLedgerMetadata
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata, LedgerState, Versioned
from pora.meta.store import MetadataStore
from simulation import invariants
from simulation.clock import SimTime, counted_threads, counting_store, tasks_in_order
from simulation.cluster import SimCluster, sim_cluster
from simulation.disk import SimDisk
from simulation.history import History
from simulation.network import LinkFaults, SimNetwork
from simulation.plans import WRITER, Fault, Plan

PASSWORD = "sim"

#: failure detection in simulated seconds: a run of many timeouts costs no real time
SIM_CONFIG = ClientConfig(
    node_timeout_s=0.5,
    connect_timeout_s=0.5,
    ensemble_change_timeout_s=2.0,
    lac_flush_interval_s=0.05,
    speculative_read_delay_s=0.02,
    tail_poll_wait_s=0.3,
    recovery_fence_timeout_s=2.0,
    # a member a few dozen entries behind the others is failed and replaced (R8): the
    # simulation's entries are tens of bytes, its slow members minutes behind
    node_backlog_bytes_max=200,
    add_call_bytes_max=100,
    # under ensemble_change_timeout_s: a writer out of nodes takes one back in time
    node_quarantine_s=0.5,
)

#: the nodes' options: small journal segments, so that runs roll segments and make
#: spares (under the disk's faults too), and a run writes megabytes, not hundreds
SIM_NODE: dict[str, Any] = {"segment_bytes": 1 << 20}


@dataclass
class RunResult:
    history: History
    ledger_id: int
    closed: tuple[int, int]
    delivered: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    #: the closed ledger's ensembles
    ensembles: tuple[Ensemble, ...] = ()
    #: unsynced writes the nodes' crashes lost, torn tails they left, and disk faults
    #: (ENOSPC, EIO, a crashed node's) their file calls met
    lost_writes: int = 0
    torn_tails: int = 0
    disk_faults_met: int = 0


def run_plan(plan: Plan, folder: Path) -> RunResult:
    """Run `plan` to its end in simulated time (data dirs under `folder`)."""

    async def run(store: MetadataStore, cluster: SimCluster) -> RunResult:
        return await Simulation(plan, store, cluster).run()

    return run_simulated(plan.seed, plan.nodes, folder, run)


T = TypeVar("T")


def run_simulated(
    seed: int,
    nodes: int,
    folder: Path,
    body: Callable[[MetadataStore, SimCluster], Awaitable[T]],
    wrap_store: Callable[[MetadataStore], MetadataStore] = lambda store: store,
) -> T:
    """`body(store, cluster)` to its end in simulated time: a SQLite store (seen
    through `wrap_store`, inside the simulated latency) and `nodes` nodes (data dirs
    under `folder`), what `run_plan` and the stream scenarios run on."""
    sim = SimTime()
    disk = SimDisk(seed)
    results: list[T] = []

    async def main() -> None:
        with counted_threads(sim, disk), use_file_calls(disk):
            async with trio.open_nursery() as outer:
                outer.start_soon(sim.drive)
                async with open_metadata(f"sqlite:///{folder}/meta.db") as raw:
                    store = counting_store(wrap_store(raw), sim, seed)
                    data = folder / "nodes"
                    async with sim_cluster(
                        store, data, nodes, sim.quiet, disk, **SIM_NODE
                    ) as cluster:
                        results.append(await body(store, cluster))
                outer.cancel_scope.cancel()

    with tasks_in_order():
        trio.run(main, clock=sim.clock)
    return results[0]


@asynccontextmanager
async def sim_client(store: MetadataStore, network: SimNetwork, name: str) -> AsyncIterator[Client]:
    """A `pora.Client` named `name` on the simulated network (as `pora.connect`
    builds one, on the simulation's store and channels)."""
    rng = random.Random(f"{network.seed}/{name}")
    async with client_on_store(store, network.opener(name, SIM_CONFIG), SIM_CONFIG, rng) as client:
        if network.history is not None:
            watch_backlog(client, network.history)
        yield client


class _DiesAfterReplacing:
    """The metadata store as one recovery sees it: once `armed()`, the recovery's
    scope `killed` is cancelled as soon as it wrote a record whose last ensemble
    names a member that joined in a recovery (R20), so the recovery ends at its next
    step, before it closes: as a process killed right after that write."""

    def __init__(
        self, inner: MetadataStore, armed: Callable[[], bool], killed: trio.CancelScope
    ) -> None:
        self._inner = inner
        self._armed = armed
        self._killed = killed

        #: the ensembles of the record as this recovery last read or wrote it
        self._ensembles: tuple[Ensemble, ...] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        current: Versioned[LedgerMetadata] = await self._inner.read_ledger(ledger_id)
        self._ensembles = current.value.ensembles
        return current

    async def update_ledger(
        self, metadata: LedgerMetadata, version: int
    ) -> Versioned[LedgerMetadata]:
        written: Versioned[LedgerMetadata] = await self._inner.update_ledger(metadata, version)
        # an IN_RECOVERY record with other ensembles than read: a member replaced
        changed = self._ensembles is not None and metadata.ensembles != self._ensembles
        self._ensembles = metadata.ensembles
        if self._armed() and metadata.state is LedgerState.IN_RECOVERY and changed:
            self._killed.cancel()
        return written


def dies_after_replacing(
    inner: MetadataStore, armed: Callable[[], bool], killed: trio.CancelScope
) -> MetadataStore:
    return cast(MetadataStore, _DiesAfterReplacing(inner, armed, killed))


def watch_backlog(client: Client, history: History) -> None:
    """Check the backlog bound (invariants.check_backlog) each time the client's node
    calls queue a batch."""
    node_calls = client._node_calls
    submit = node_calls.submit
    bound = client.config.node_backlog_bytes_max

    def checked(
        caller: NodeCaller[EnsembleMember], node: EnsembleMember, entries: Batch, size: int
    ) -> None:
        submit(caller, node, entries, size)
        queued = node_calls.queued_bytes(node)
        invariants.check_backlog(history, node.address, queued, node_calls.beyond.used, bound)

    node_calls.submit = checked  # type: ignore[method-assign]


def payload_for(appender: int, k: int) -> bytes:
    return f"a{appender}-k{k}|".encode() * (1 + (appender + k) % 4)


class Simulation:
    def __init__(self, plan: Plan, store: MetadataStore, cluster: SimCluster) -> None:
        self.plan = plan
        self.store = store
        self.cluster = cluster
        self.history = History(plan.seed, store_url=store.url)
        faults = LinkFaults(drop_rate=plan.drop_rate)
        self.network = SimNetwork(cluster, plan.seed, faults, self.history)
        self.rng = random.Random(f"{plan.seed}/plan")
        self.ledger_id = -1
        #: recoveries to kill right after they replaced a member (kill-recovery)
        self.killing: set[str] = set()
        #: each running recovery's scope, which a kill fault cancels
        self.recovery_scopes: dict[str, trio.CancelScope] = {}
        #: recoveries a kill fault stopped
        self.killed: set[str] = set()
        self.writer: LedgerWriter | None = None

    async def run(self) -> RunResult:
        plan, history = self.plan, self.history
        async with sim_client(self.store, self.network, WRITER) as client:
            writer = await client.create_ledger(
                plan.ensemble, plan.write_quorum, plan.ack_quorum, password=PASSWORD
            )
            self.ledger_id = writer.ledger_id
            self.writer = writer
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
                    if plan.delete_at_s is not None:
                        racing.start_soon(self._delete, plan.delete_at_s)
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
            except LedgerFenced as fenced:
                history.writer_failed(fenced)
                history.fenced(WRITER, writer.last_add_confirmed)
                return
            except PoraError as error:
                history.writer_failed(error)
                history.failed(f"{WRITER} a{appender}-k{k}", error)
                return
            history.acknowledged(WRITER, self.ledger_id, entry_id, payload, started)
            invariants.check_fence(history, WRITER, writer.last_add_confirmed)
            await trio.sleep(rng.uniform(0.0, self.plan.append_pause_s))

    async def _recovery(self, name: str, at_s: float) -> None:
        await trio.sleep(at_s)
        history = self.history
        history.note(f"{name} starts")
        killed = trio.CancelScope()
        store = dies_after_replacing(self.store, lambda: name in self.killing, killed)
        async with sim_client(store, self.network, name) as client:
            self.recovery_scopes[name] = killed
            with killed:
                try:
                    reader = await client.open_ledger(self.ledger_id, PASSWORD)
                except PoraError as error:
                    history.failed(name, error)
                    return
                finally:
                    del self.recovery_scopes[name]
            if killed.cancelled_caught:
                if name in self.killed:
                    history.note(f"{name} killed before it returned")
                else:
                    history.note(f"{name} killed right after it replaced a member, before closing")
                return
            history.closed_at(name, self.ledger_id, reader.last_entry_id, reader.metadata.length)
            try:
                async for entry_id, data in reader.read_entries(0, reader.last_entry_id):
                    history.read(name, self.ledger_id, entry_id, data)
            except PoraError as error:
                history.failed(f"{name} read", error)

    async def _delete(self, at_s: float) -> None:
        """R26: the ledger deleted (with its password) while its writer appends. Once
        the delete returned its fence had covered the ensemble: no append started
        later succeeds, no entry the writer had not issued by then is acknowledged,
        and every append failing from then on fails with LedgerDeleted."""
        await trio.sleep(at_s)
        history = self.history
        history.delete_started()
        held = self._holders()
        async with sim_client(self.store, self.network, "deleter") as client:
            try:
                await client.delete_ledger(self.ledger_id, PASSWORD)
            except PoraError as error:
                history.failed("deleter", error)
                return
        assert self.writer is not None
        # a node (the same data dir) that held the ledger when the delete began and
        # holds nothing of it now deleted it: it must never hold it again
        now = self._holders()
        gone = {
            (address, instance)
            for address, instance in held.items()
            if address not in now and self._instance(address) == instance
        }
        issued = self.writer._adds.next_entry_id - 1
        history.deleted(WRITER, self.ledger_id, issued, gone)

    def _instance(self, address: str) -> str | None:
        if address not in self.cluster.nodes:
            return None  # crashed: not running now
        return self.cluster.instance_id(address)

    def _holders(self) -> dict[str, str]:
        """The running nodes that hold the ledger, with their data dirs' instance ids."""
        holding = {}
        for address, node in self.cluster.nodes.items():
            try:
                node.ledger_info(self.ledger_id)
            except NoSuchLedger:
                continue
            holding[address] = self.cluster.instance_id(address)
        return holding

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
        if fault.kind == "lag" and self.writer is not None:
            members = self.writer.metadata.ensembles[-1].members
            address = members[fault.node % len(members)].address
        network, cluster = self.network, self.cluster
        self.history.note(f"fault {fault.kind} {address} for {fault.for_s} s")
        if fault.kind == "crash":
            await cluster.crash(address)
            undo.start_soon(self._later, fault.for_s, cluster.restart, address)
        elif fault.kind == "wipe":
            await cluster.wipe(address)
        elif fault.kind == "rollback":
            await cluster.copy(address)
            undo.start_soon(self._later, fault.for_s, cluster.roll_back, address)
        elif fault.kind == "rollback-killed":
            await cluster.copy(address)
            undo.start_soon(self._later, fault.for_s, self._roll_back_killed, address)
        elif fault.kind in ("disk-full", "disk-error"):
            errno = ENOSPC if fault.kind == "disk-full" else EIO
            await cluster.fail_disk(address, errno, fault.calls)
            undo.start_soon(self._later, fault.for_s, cluster.mend_disk, address)
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
        elif fault.kind == "kill-recovery":
            try:
                record = (await self.store.read_ledger(self.ledger_id)).value
            except NoSuchLedgerMetadata:
                # a planned delete came first: no recovery is left to kill
                self.history.note(f"{fault.client}'s kill finds the ledger deleted")
                return
            members = record.ensembles[-1].members
            short = record.write_quorum - record.ack_quorum + 1
            cut = [members[(fault.node + k) % len(members)].address for k in range(short)]
            self.history.note(f"{fault.client}'s adds to {cut} fail; killed once it replaced")
            self.killing.add(fault.client)
            for member in cut:
                network.cut_adds(fault.client, member)

            async def mend(address: str) -> None:
                network.mend_adds(fault.client, address)

            for member in cut:
                undo.start_soon(self._later, fault.for_s, mend, member)
        elif fault.kind == "kill":
            scope = self.recovery_scopes.get(fault.client)
            if scope is None:  # not started yet, or done
                self.history.note(f"{fault.client}'s kill finds no recovery running")
            else:
                self.killed.add(fault.client)
                scope.cancel()
        elif fault.kind in ("slow", "lag"):
            network.faults.slowdown[address] = fault.factor

            async def speed_up(address: str) -> None:
                network.faults.slowdown.pop(address, None)

            undo.start_soon(self._later, fault.for_s, speed_up, address)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    async def _roll_back_killed(self, address: str) -> None:
        await self.cluster.roll_back(address, killed_in_mark_interval=True)

    async def _later(
        self, delay_s: float, action: Callable[[str], Awaitable[None]], address: str
    ) -> None:
        await trio.sleep(delay_s)
        self.history.note(f"undo {action.__name__} {address}")
        await action(address)

    async def _audit(self) -> RunResult:
        """Heal everything (a node whose journal failed restarted), recover the ledger,
        read it back whole, check replicas."""
        history, network = self.history, self.network
        network.heal_all()
        for address in self.cluster.addresses:
            await self.cluster.mend_disk(address)
            await self.cluster.restart(address)
        history.note("healed: every node up, every link and disk mended")
        if self.ledger_id in history.deleted_ledgers:
            return await self._audit_deleted()
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
            meta.ensembles,
            *self._disk_figures(),
        )

    def _disk_figures(self) -> tuple[int, int, int]:
        disk = self.cluster.disk
        if disk is None:
            return 0, 0, 0
        return disk.reverted_writes, disk.torn_tails, disk.faults_met

    async def _audit_deleted(self) -> RunResult:
        """R26: a deleted ledger is gone for every client: no record to open, and no
        node that took the delete creates it again from a late request."""
        history = self.history
        async with sim_client(self.store, self.network, "auditor") as client:
            try:
                reader = await client.open_ledger(self.ledger_id, PASSWORD)
            except NoSuchLedger:
                history.note(f"auditor: ledger {self.ledger_id} is gone")
            else:
                invariants.fail(
                    history,
                    f"ledger {self.ledger_id} was deleted, yet the auditor opened it "
                    f"(closed at {reader.last_entry_id})",
                )
        for address, node in self.cluster.nodes.items():
            channel = LocalChannel(node, address)
            try:
                await channel.read_entry(self.ledger_id, 0)
            except (NoSuchEntry, NoSuchLedger):
                continue
            if (address, self.cluster.instance_id(address)) in history.deleted_on:
                invariants.fail(
                    history,
                    f"node {address} deleted ledger {self.ledger_id} and holds it again",
                )
        return RunResult(
            history,
            self.ledger_id,
            (-1, 0),
            dict(self.network.delivered),
            self.network.dropped,
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
                decoded = decode_entry(self.ledger_id, entry_id, stored, token=meta.token)
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
