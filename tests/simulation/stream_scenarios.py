"""Simulated runs of a stream (pora/streams): a `StreamPlan` drawn from a seed, run by
`run_stream_plan` under the same `SimTime`, cluster and network as the ledger
scenarios, every event checked by a `StreamHistory` as it is recorded.

A run: a stream whose segments roll every few entries; writer-1 appends from several
tasks; at a planned time writer-2 takes the stream over (writer-1 is fenced:
WriterFenced) and appends from tasks of its own; a subscriber runs throughout, a
watcher checks every version of the document, a reader reads midway. Node crashes
and partitions fall at planned times, or right after the document's Nth commit (a
rollover's, a takeover's), or when the takeover starts; and one of the document's
compare-and-sets may take while its reply is lost (the store answers
MetadataTimeout after committing). Transaction processes (stream_txn.py) begin,
append and commit (with a key, an app version or neither), abort, or die, beside the
writers. Then the network heals, the nodes restart, the abandoned transactions are
collected, and a final read and the caught-up subscriber are checked against what was
acknowledged and committed."""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, cast

import trio

from journal.errors import PoraError
from pora import Client
from pora.client.replication.client import client_on_store
from pora.meta.errors import NoSuchDocument, NoSuchLedgerMetadata
from pora.meta.records import LedgerMetadata, Versioned
from pora.meta.store import MetadataStore
from pora.streams.document import Segment
from pora.streams.errors import WriterFenced
from pora.streams.position import Position
from pora.streams.records import StreamRecord
from pora.streams.writer import StreamWriter
from simulation import scenarios
from simulation.cluster import SimCluster
from simulation.network import SimNetwork
from simulation.plans import Fault
from simulation.scratch import scratch_folder
from simulation.stream_invariants import StreamHistory
from simulation.stream_txn import (
    DocumentWrites,
    TxnPlan,
    collect_and_check,
    run_transaction,
    txn_plans_from_seed,
)

STREAM = "sim-stream"
#: the smallest segment a stream takes (64 KiB); payloads of ~8 KiB roll it every
#: eight entries or so
SEGMENT_BYTES = 64 << 10
PAYLOAD_BYTES = 8 << 10

#: the ledger scenarios' failure detection, with bounds sized for 8 KiB entries
STREAM_CONFIG = replace(
    scenarios.SIM_CONFIG, node_backlog_bytes_max=1 << 20, add_call_bytes_max=64 << 10
)


@dataclass(frozen=True)
class StreamFault:
    """`fault` (a crash or a partition, as the ledger scenarios' `Fault`), at its
    `at_s`, or, with `after_commit`, right after the document's commit of that number
    (counted over every client), or, with `at_takeover`, when writer-2 starts."""

    fault: Fault
    after_commit: int | None = None
    at_takeover: bool = False


@dataclass(frozen=True)
class StreamPlan:
    seed: int
    nodes: int = 5
    appenders: int = 3
    appends_each: int = 8
    #: when writer-2 takes over (None: writer-1 writes alone)
    takeover_at_s: float | None = 0.2
    #: when writer-3 takes over too, racing writer-2 (None: it does not)
    racer_at_s: float | None = None
    faults: tuple[StreamFault, ...] = ()
    #: the document commit whose reply the store loses (MetadataTimeout after it took)
    lose_reply_of_commit: int | None = None
    #: the writer's pause between two appends of one task, at most (simulated s)
    append_pause_s: float = 0.03
    #: transaction processes (tests/simulation/stream_txn.py)
    transactions: tuple[TxnPlan, ...] = ()


def stream_plan_from_seed(seed: int) -> StreamPlan:
    rng = random.Random(f"{seed}/stream-plan")
    nodes = 5
    faults: list[StreamFault] = []
    for _ in range(rng.randint(0, 3)):
        fault = Fault(
            at_s=round(rng.uniform(0.0, 0.6), 4),
            kind=rng.choice(["crash", "crash", "partition"]),
            node=rng.randrange(nodes),
            for_s=round(rng.uniform(0.05, 0.6), 3),
            client=rng.choice(["writer-1", "writer-2", "subscriber"]),
        )
        timing = rng.random()
        if timing < 0.4:
            faults.append(StreamFault(fault, after_commit=rng.randint(1, 6)))
        elif timing < 0.6:
            faults.append(StreamFault(fault, at_takeover=True))
        else:
            faults.append(StreamFault(fault))
    appenders, appends_each = rng.randint(1, 4), rng.randint(4, 12)
    takeover_at_s = round(rng.uniform(0.02, 0.2), 4) if rng.random() < 0.8 else None
    return StreamPlan(
        seed=seed,
        nodes=nodes,
        appenders=appenders,
        appends_each=appends_each,
        takeover_at_s=takeover_at_s,
        faults=tuple(faults),
        lose_reply_of_commit=rng.randint(1, 6) if rng.random() < 0.5 else None,
        transactions=txn_plans_from_seed(seed, nodes),
        racer_at_s=racer_from_seed(seed, takeover_at_s),
    )


def racer_from_seed(seed: int, takeover_at_s: float | None) -> float | None:
    """For some seeds with a takeover, writer-3's start: within 5 ms of writer-2's,
    so that the two takeovers race (their epoch compare-and-sets, the recoveries of
    one OPEN segment, each fencing the other). Drawn apart from the plan's other
    draws, so the seeds' faults and timings stay what they were."""
    rng = random.Random(f"{seed}/racer")
    if takeover_at_s is None or rng.random() >= 0.3:
        return None
    return round(max(0.0, takeover_at_s + rng.uniform(-0.005, 0.005)), 4)


@dataclass
class StreamRunResult:
    history: StreamHistory
    final: dict[Position, bytes]
    #: the document's commits (every client's), and whether writer-1 was fenced
    commits: int = 0
    fenced: bool = False
    segments: int = 0
    lost_replies: int = 0


def run_stream_plan(plan: StreamPlan, folder: Path | None = None) -> StreamRunResult:
    """Run `plan` to its end in simulated time (data dirs under `folder`, or a
    temporary folder in memory: simulation/scratch.py)."""
    if folder is None:
        with scratch_folder("pora-stream-sim-") as temporary:
            return run_stream_plan(plan, Path(temporary))

    async def run(store: MetadataStore, cluster: SimCluster) -> StreamRunResult:
        return await StreamSimulation(plan, store, cluster).run()

    return scenarios.run_simulated(plan.seed, plan.nodes, folder, run, serial_store)


V = TypeVar("V")

#: how often a watch through `SerialStore` polls, in simulated seconds
_WATCH_POLL_S = 0.01


#: the store's calls that change nothing (every other call counts as a change)
_READ_ONLY_CALLS = frozenset(
    {"read_ledger", "list_ledgers", "list_nodes", "read_document", "list_documents"}
    | {"cluster_id", "node_mark"}
)


class SerialStore:
    """The SQLite store one call at a time, in the order the tasks call it, its watches
    polled in simulated time. The SQLite store runs reads in threads beside its writer
    thread, and a watch polls on its own: whether a read sees a write made at the same
    simulated moment would depend on real time, and a seed would not replay. A stream
    run reads and watches its document from several clients while writers change it.

    Every call goes through here, so a watch's poll asks SQLite again only once some
    call that may change the store has ended since its last read: a poll that would
    read the same record costs no thread hop (about a fifth of a seed's store calls,
    each a hop to SQLite's thread and back in real time)."""

    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner
        self._lock = trio.Lock()  # FIFO: callers go in the order they came
        #: how many calls that may change the store have ended
        self.changes = 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute
        read_only = name in _READ_ONLY_CALLS

        @functools.wraps(attribute)
        async def serial(*args: Any, **kwargs: Any) -> Any:
            async with self._lock:
                try:
                    return await attribute(*args, **kwargs)
                finally:
                    # also when it failed: a write may take and still raise
                    if not read_only:
                        self.changes += 1

        return serial

    def watch_document(
        self, space: str, name: str, after_version: int | None = None
    ) -> AsyncIterator[Versioned[bytes]]:
        read = self.__getattr__("read_document")
        return _polled(self, lambda: read(space, name), NoSuchDocument, after_version)

    def watch_ledger(
        self, ledger_id: int, after_version: int | None = None
    ) -> AsyncIterator[Versioned[LedgerMetadata]]:
        read = self.__getattr__("read_ledger")
        return _polled(self, lambda: read(ledger_id), NoSuchLedgerMetadata, after_version)


async def _polled(
    store: SerialStore,
    read: Callable[[], Awaitable[Versioned[V]]],
    gone: type[Exception],
    after_version: int | None,
) -> AsyncIterator[Versioned[V]]:
    """A store watch (each version past the last yielded; the end when the record is
    gone; `gone` raised when it is absent at the start) by polling `read` every
    `_WATCH_POLL_S`, skipping the reads while `store` has seen no change."""
    first = await read()
    seen = first.version if after_version is None else after_version
    read_at = -1  # the store's changes when the record was last read (not yet)
    try:
        while True:
            if store.changes != read_at:  # else the record read last is still the same
                read_at = store.changes
                current = await read()
                if current.version > seen:
                    seen = current.version
                    yield current
                    continue
            await trio.sleep(_WATCH_POLL_S)
    except gone:
        return  # deleted: the watch ends


def serial_store(inner: MetadataStore) -> MetadataStore:
    return cast(MetadataStore, SerialStore(inner))


@asynccontextmanager
async def sim_client(store: MetadataStore, network: SimNetwork, name: str) -> AsyncIterator[Client]:
    """A `pora.Client` named `name` on the simulated network, with `STREAM_CONFIG`."""
    rng = random.Random(f"{network.seed}/{name}")
    async with client_on_store(
        store, network.opener(name, STREAM_CONFIG), STREAM_CONFIG, rng
    ) as client:
        yield client


def payload_for(writer: str, appender: int, k: int) -> bytes:
    head = f"{writer}/a{appender}/k{k}|".encode()
    return (head * (PAYLOAD_BYTES // len(head) + 1))[:PAYLOAD_BYTES]


class _CommitHooks(DocumentWrites):
    """The metadata store as a writer sees it: each compare-and-set of the stream's
    document that takes is counted (over every writer), runs the faults planned for
    that commit, and, for the planned one, answers MetadataTimeout although it took
    (a reply lost on its way back)."""

    def __init__(self, inner: MetadataStore, run: StreamSimulation) -> None:
        super().__init__(inner)
        self._run = run

    def took(self, data: bytes, version: int) -> None:
        run = self._run
        run.commits += 1
        run.history.note(f"document commit {run.commits} (version {version})")
        for planned in run.plan.faults:
            if planned.after_commit == run.commits:
                run.start_fault(planned.fault)
        if run.commits == run.plan.lose_reply_of_commit:
            run.lost_replies += 1
            run.history.note(f"the reply of commit {run.commits} is lost")
            raise self.lost_reply()


class StreamSimulation:
    def __init__(self, plan: StreamPlan, store: MetadataStore, cluster: SimCluster) -> None:
        self.plan = plan
        self.store = store
        self.cluster = cluster
        self.history = StreamHistory(plan.seed)
        self.network = SimNetwork(cluster, plan.seed)
        self.commits = 0
        self.lost_replies = 0
        self.fenced = False
        self._nursery: trio.Nursery | None = None
        #: faults under way, and whether new ones may start (not once healing began)
        self._faults_running = 0
        self._faults_idle = trio.Event()
        self._faults_idle.set()
        self._faults_off = False
        #: set (and replaced) each time the subscriber gets an entry
        self._subscriber_moved = trio.Event()

    stream_name = STREAM

    def hooked(self) -> MetadataStore:
        return cast(MetadataStore, _CommitHooks(self.store, self))

    def client(self, store: MetadataStore, name: str) -> AbstractAsyncContextManager[Client]:
        """A client named `name` on the simulated network, on `store`."""
        return sim_client(store, self.network, name)

    def start_fault(self, fault: Fault) -> None:
        assert self._nursery is not None
        if not self._faults_off:
            self._faults_running += 1
            if self._faults_running == 1:
                self._faults_idle = trio.Event()
            self._nursery.start_soon(self._fault, fault)

    async def _fault(self, fault: Fault) -> None:
        address = self.cluster.addresses[fault.node % len(self.cluster.addresses)]
        self.history.note(f"fault {fault.kind} {address} ({fault.client}) for {fault.for_s}s")
        if fault.kind == "crash":
            await self.cluster.crash(address)
            await trio.sleep(fault.for_s)
            await self.cluster.restart(address)
        else:
            self.network.partition(fault.client, address)
            await trio.sleep(fault.for_s)
            self.network.heal(fault.client, address)
        self.history.note(f"fault {fault.kind} {address} ends")
        self._faults_running -= 1
        if self._faults_running == 0:
            self._faults_idle.set()

    async def _timed_faults(self) -> None:
        for planned in sorted(self.plan.faults, key=lambda f: f.fault.at_s):
            if planned.after_commit is None and not planned.at_takeover:
                await trio.sleep_until(planned.fault.at_s)
                self.start_fault(planned.fault)

    async def run(self) -> StreamRunResult:
        plan, history = self.plan, self.history
        async with trio.open_nursery() as faults:
            self._nursery = faults
            async with sim_client(self.hooked(), self.network, "creator") as client:
                await client.create_stream(STREAM, segment_bytes_max=SEGMENT_BYTES)
            history.note(f"created stream {STREAM}")
            async with trio.open_nursery() as background:
                background.start_soon(self._timed_faults)
                background.start_soon(self._subscriber)
                background.start_soon(self._watcher)
                async with trio.open_nursery() as writing:
                    writing.start_soon(self._writer, "writer-1", 0.0)
                    if plan.takeover_at_s is not None:
                        writing.start_soon(self._writer, "writer-2", plan.takeover_at_s)
                    if plan.racer_at_s is not None:
                        writing.start_soon(self._writer, "writer-3", plan.racer_at_s)
                    writing.start_soon(self._reader)
                    for txn in plan.transactions:
                        writing.start_soon(run_transaction, self, txn)
                await self._heal()
                await collect_and_check(self)
                final = await self._final_read()
                await self._subscriber_caught_up(final)
                background.cancel_scope.cancel()
            faults.cancel_scope.cancel()
        return StreamRunResult(
            history,
            final,
            commits=self.commits,
            fenced=self.fenced,
            segments=len(history.segments),
            lost_replies=self.lost_replies,
        )

    async def _heal(self) -> None:
        self._faults_off = True
        await self._faults_idle.wait()
        self.network.heal_all()
        for address in self.cluster.addresses:
            await self.cluster.restart(address)
        self.history.note("healed: every node up, every link mended")

    async def _writer(self, name: str, at_s: float) -> None:
        await trio.sleep(at_s)
        history = self.history
        history.note(f"{name} opens")
        if name == "writer-2":
            for planned in self.plan.faults:
                if planned.at_takeover:
                    self.start_fault(planned.fault)
        async with sim_client(self.hooked(), self.network, name) as client:
            stream = await client.open_stream(STREAM)
            for attempt in range(20):
                try:
                    async with stream.open_writer() as writer:
                        opened = history.note(f"{name} open at epoch {writer.epoch}")
                        if name != "writer-1":
                            # its own OPEN segment, the first it appends to
                            own = writer._segment
                            assert own is not None
                            history.took_over(name, own.seq, opened, writer.epoch)
                        await self._append_all(name, writer)
                except WriterFenced:
                    # a takeover may fence writer-1 while it opens or closes
                    self.fenced = True
                    history.note(f"{name} fenced")
                    return
                except PoraError as error:
                    history.failed(f"{name} (attempt {attempt})", error)
                    if name == "writer-1" and self.plan.takeover_at_s is not None:
                        return  # writer-2's takeover recovers what it left
                    await trio.sleep(0.5)
                else:
                    history.note(f"{name} closed")
                    return
            history.note(f"{name} gave up")

    async def _append_all(self, name: str, writer: StreamWriter) -> None:
        async with trio.open_nursery() as appenders:
            for k in range(self.plan.appenders):
                appenders.start_soon(self._appender, name, writer, k)

    async def _appender(self, name: str, writer: StreamWriter, appender: int) -> None:
        history = self.history
        rng = random.Random(f"{self.plan.seed}/{name}/appender/{appender}")
        for k in range(self.plan.appends_each):
            payload = payload_for(name, appender, k)
            started = history.note(f"{name} append a{appender}/k{k}")
            try:
                position = await writer.append(payload)
            except WriterFenced:
                self.fenced = True
                history.note(f"{name} a{appender} fenced")
                return
            except PoraError as error:
                history.failed(f"{name} a{appender}/k{k}", error)
                return
            history.acknowledged(name, position, payload, started)
            await trio.sleep(rng.uniform(0.0, self.plan.append_pause_s))

    async def _subscriber(self) -> None:
        async with sim_client(self.store, self.network, "subscriber") as client:
            stream = await client.open_stream(STREAM)
            while True:
                start = None
                if self.history.subscribed:
                    last = self.history.subscribed[-1]
                    start = Position(last.segment, last.entry + 1)
                try:
                    async for position, payload in stream.subscribe(start):
                        self.history.subscriber_got(position, payload)
                        moved, self._subscriber_moved = self._subscriber_moved, trio.Event()
                        moved.set()
                except PoraError as error:
                    # a subscriber's own failure (its nodes unreachable): it goes on
                    # from after the last entry it got
                    self.history.failed("subscriber", error)
                    await trio.sleep(0.2)

    async def _segments(self, client_store: MetadataStore) -> list[Segment]:
        record = StreamRecord(client_store, STREAM)
        doc = await record.read()
        return [segment async for segment in record.segments_from(doc.value, 0)]

    async def _watcher(self) -> None:
        """Every version of the document it sees: nothing visible disappears."""
        record = StreamRecord(self.store, STREAM)
        doc = await record.read()
        while True:
            segments = [s async for s in record.segments_from(doc.value, 0)]
            self.history.document_seen(f"document version {doc.version}", segments)
            doc = await record.next_change(doc.version)

    async def _reader(self) -> None:
        """A read midway, while the writers write."""
        await trio.sleep(0.3)
        async with sim_client(self.store, self.network, "reader") as client:
            stream = await client.open_stream(STREAM)
            try:
                async for position, payload in stream.read():
                    self.history.read("reader", position, payload)
            except PoraError as error:
                self.history.failed("reader", error)

    async def _final_read(self) -> dict[Position, bytes]:
        history = self.history
        async with sim_client(self.store, self.network, "auditor") as client:
            stream = await client.open_stream(STREAM)
            # a writer that gave up leaves its segment OPEN: take over and close it,
            # so that the read's end is where its recovery fixes it
            async with stream.open_writer() as auditor:
                history.note(f"auditor took over at epoch {auditor.epoch}")
            final: dict[Position, bytes] = {}
            async for position, payload in stream.read():
                history.read("final read", position, payload)
                final[position] = payload
            history.document_seen("the final document", await self._segments(self.store))
        history.check_final_read(final)
        history.check_final_transactions(final)
        return final

    async def _subscriber_caught_up(self, final: dict[Position, bytes]) -> None:
        if final:
            last = max(final)
            with trio.move_on_after(60.0):
                while not self.history.subscribed or self.history.subscribed[-1] < last:
                    await self._subscriber_moved.wait()
        self.history.check_subscriber(final)
