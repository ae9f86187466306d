"""`pora.connect(url)` and `Client`: a replicating client on a metadata store.

    async with pora.connect("sqlite:pora-cluster/meta.db") as client:
        async with await client.create_ledger(ensemble_size=3, ack_quorum=2) as ledger:
            await ledger.append(b"payload")

The client holds the metadata store, one `NodePool` and one `NodeCalls`
(`pora.client.node_calls`: one queue and call per node carrying every ledger's
adds, set up by `backlog.py`) shared by all its ledgers, and a task group running
the node calls' dispatch, each writer's tasks and each node connection's holder. It
works under asyncio and trio (anyio).
"""

from __future__ import annotations

import logging
import random
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from journal.errors import PoraError
from ledger.errors import NoSuchLedger
from netio.budget import Budget
from netio.security import master_key_from_password
from pora.client.lone_errors import lone_error_unwrapped
from pora.client.node_pool import ChannelOpener, NodePool, tcp_channels
from pora.client.replication.arguments import (
    check_password,
    check_quorums,
    check_url,
    ledger_id_in_range,
)
from pora.client.replication.backlog import client_node_calls
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.ledger_records import check_password as check_master_key
from pora.client.replication.core.ledger_records import marked_deleting, new_ledger
from pora.client.replication.core.placement import choose_ensemble
from pora.client.replication.ensemble_change import WriterContext
from pora.client.replication.errors import ClientClosed, DeleteFailed, RecoveryFailed
from pora.client.replication.reader import LedgerReader, open_ledger
from pora.client.replication.recovery import Recovery
from pora.client.replication.writer import LedgerWriter
from pora.client.waiting import event_factory
from pora.meta.backends import open_metadata
from pora.meta.errors import MetadataTimeout, MetadataVersionConflict, NoSuchLedgerMetadata
from pora.meta.records import EnsembleMember, LedgerMetadata, LedgerState, Versioned
from pora.meta.store import MetadataStore
from pora.streams import deletion
from pora.streams import stream as streams
from pora.streams.document import StreamConfig
from pora.streams.stream import Stream, StreamInfo
from pora.streams.transaction_fields import (
    APP_IDS_MAX_DEFAULT,
    COMMIT_KEYS_MAX_DEFAULT,
    TXN_IDLE_S_MAX_DEFAULT,
    TXN_PENDING_MAX_DEFAULT,
    TXN_SEGMENTS_MAX_DEFAULT,
)

_log = logging.getLogger("pora.client")

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from pora.client.replication.metrics import ClientMetrics

#: ledger records read per page by `list_ledgers`
_LIST_PAGE = 1000
#: a delete re-reads and retries this many times when the record keeps changing
_DELETE_ATTEMPTS = 5


class Client:
    def __init__(
        self,
        store: MetadataStore,
        pool: NodePool,
        task_group: anyio.abc.TaskGroup,
        config: ClientConfig,
        rng: random.Random,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self._pool = pool
        self._task_group = task_group
        new_event = event_factory()
        pending_bytes = Budget(config.pending_bytes_max, "the client's pending bytes", new_event)
        node_calls = self._node_calls = client_node_calls(pool, config, pending_bytes, new_event)
        task_group.start_soon(node_calls.run)
        self._context = WriterContext(
            store,
            pool,
            config,
            rng,
            pending_bytes,
            node_calls,
            new_event,
            None if metrics is None else _client_metrics(metrics, pending_bytes),
        )
        #: the writers not closed yet (the client fails their pending appends on exit)
        self._writers: set[LedgerWriter] = set()
        #: the readers it opened, told when it ends (their reads then raise ClientClosed)
        self._readers: weakref.WeakSet[LedgerReader] = weakref.WeakSet()
        self._closed = False

    def _check_open(self, doing: str) -> None:
        if self._closed:
            raise ClientClosed(None, f"it cannot {doing}")

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        password: str | bytes = "",
        custom_metadata: Mapping[str, bytes] | None = None,
    ) -> LedgerWriter:
        """A new OPEN ledger on `ensemble_size` writable nodes (R1, R2) with the write
        quorum (default: E) and the ack quorum (default: Qw); returns its writer.
        NotEnoughNodes (nothing created) when fewer writable nodes are registered.
        InvalidArgumentType (a TypeError) for a quorum that is not an int (a bool or a
        float is refused) or a password that is not str or bytes; InvalidArgument (a
        ValueError) for quorums that break E >= Qw >= Qa >= 1."""
        self._check_open("create a ledger")
        ensemble_size, write_quorum, ack_quorum = check_quorums(
            ensemble_size, write_quorum, ack_quorum
        )
        master_key = master_key_from_password(check_password(password))
        nodes = await self.store.list_nodes(writable_only=True)
        members = choose_ensemble(nodes, ensemble_size, self._context.rng)
        ledger_id = await self.store.allocate_ledger_id()
        record = await self.store.create_ledger(
            new_ledger(
                ledger_id,
                write_quorum,
                ack_quorum,
                members,
                master_key,
                int(time.time() * 1000),
                custom_metadata,
                # the ledger's incarnation (never 0: 0 is "no token")
                self._context.rng.getrandbits(64) or 1,
            )
        )
        writer = LedgerWriter(self._context, record, master_key)
        self._writers.add(writer)
        await writer.start(self._task_group, self._writers.discard)
        return writer

    async def open_ledger(
        self, ledger_id: int, password: str | bytes = "", *, recover: bool = True
    ) -> LedgerReader:
        """A reader of the ledger (`Unauthorized` for a wrong password, `NoSuchLedger`
        when it has no record). `recover=True` (the default) recovers and closes an open
        ledger first: fencing its writer, whose later appends fail with LedgerFenced
        (R16..R22). `recover=False` reads an open ledger as it grows, never past its
        LAC (R23), without disturbing its writer. `NoSuchLedger` too for an id no
        ledger can have (outside [0, 2**63)); InvalidArgumentType for an id that is
        not an int or a password that is not str or bytes."""
        self._check_open("open a ledger")
        check_password(password)
        async with self._no_such_ledger(ledger_id):
            reader = await open_ledger(
                self.store,
                self._pool.channel,
                self.config,
                self._context.rng,
                ledger_id,
                password,
                recover,
                self._context.metrics,
            )
        self._readers.add(reader)
        return reader

    @asynccontextmanager
    async def _no_such_ledger(self, ledger_id: int) -> AsyncIterator[None]:
        if not ledger_id_in_range(ledger_id):
            raise NoSuchLedger(
                ledger_id, "anywhere: ledger ids are ints in [0, 2**63), and this one is not"
            )
        try:
            yield
        except NoSuchLedgerMetadata as error:
            raise NoSuchLedger(ledger_id, f"in the metadata store {self.store.url}") from error

    async def delete_ledger(self, ledger_id: int, password: str | bytes = "") -> None:
        """R26: check the password (Unauthorized); mark an open record deleting and
        in recovery (compare-and-set: the writer's ensemble changes are refused, R11),
        fence the last ensemble until the fence covers it (R17: the writer gets no
        acknowledgement after that, and its appends fail with LedgerDeleted), delete
        the record (compare-and-set), then delete the ledger on every node of every
        ensemble, best effort: a node keeps a tombstone and refuses the ledger for
        good; one that cannot be reached keeps the entries as garbage for the cluster
        tools. NoSuchLedger when the ledger has no record; DeleteFailed (the record
        left marked, a retry finishes) when too few members can be fenced."""
        self._check_open("delete a ledger")
        master_key = master_key_from_password(check_password(password))
        attempt = 0
        while True:
            async with self._no_such_ledger(ledger_id):
                record = await self.store.read_ledger(ledger_id)
            check_master_key(record.value, master_key)
            try:
                record = await self._fence_for_delete(record, master_key)
                await self.store.delete_ledger(ledger_id, record.version)
                break
            except NoSuchLedgerMetadata as gone:  # another delete finished first
                raise NoSuchLedger(ledger_id, f"in the metadata store {self.store.url}") from gone
            except DeleteFailed:
                # members that deleted the ledger answer "no such ledger", not "fenced",
                # and a node deletes a ledger only once its record is gone: a racing
                # delete that finished first left this fence short of its cover
                async with self._no_such_ledger(ledger_id):
                    await self.store.read_ledger(ledger_id)
                raise
            except (MetadataVersionConflict, MetadataTimeout):
                # a recovery, the writer's last ensemble change or close, or a write of
                # ours that timed out: read again (the fence is repeated on the record)
                attempt += 1
                if attempt >= _DELETE_ATTEMPTS:
                    raise
        await self._delete_on_nodes(record.value, master_key)

    async def _fence_for_delete(
        self, record: Versioned[LedgerMetadata], master_key: bytes
    ) -> Versioned[LedgerMetadata]:
        """R26: the record marked deleting (unless closed) with its last ensemble
        fenced; the version the delete's compare-and-set must name."""
        marked = marked_deleting(record.value)
        if marked is not None:
            record = await self.store.update_ledger(marked, record.version)
        if record.value.state is not LedgerState.CLOSED:
            fencing = Recovery(self._pool.channel, self.config, record, master_key)
            try:
                await fencing.fence()
            except RecoveryFailed as failed:
                raise DeleteFailed(record.value.ledger_id, failed.what) from failed
        return record

    async def _delete_on_nodes(self, metadata: LedgerMetadata, master_key: bytes) -> None:
        members: dict[str, EnsembleMember] = {}
        for ensemble in metadata.ensembles:
            for member in ensemble.members:
                members[member.address] = member  # the latest instance at each address
        timeout_s = self.config.node_timeout_s
        ledger_id = metadata.ledger_id

        async def delete_on(member: EnsembleMember) -> None:
            with anyio.move_on_after(timeout_s) as scope:
                try:
                    channel = await self._pool.channel(member.address)
                    await channel.delete_ledger(
                        ledger_id, master_key=master_key, timeout_s=timeout_s
                    )
                except NoSuchLedger:
                    pass
                except (PoraError, OSError) as error:
                    _log.warning(
                        "ledger %d deleted, but node %s kept its entries (%s): garbage for "
                        "the cluster tools to collect",
                        ledger_id,
                        member.address,
                        error,
                    )
            if scope.cancelled_caught:
                _log.warning(
                    "ledger %d deleted, but node %s did not answer in %.1f s: its entries "
                    "are garbage for the cluster tools to collect",
                    ledger_id,
                    member.address,
                    timeout_s,
                )

        async with anyio.create_task_group() as tasks:
            for member in members.values():
                tasks.start_soon(delete_on, member)

    async def list_ledgers(self) -> AsyncIterator[LedgerMetadata]:
        """Every ledger record, by increasing id (read a page at a time)."""
        self._check_open("list ledgers")
        after = -1
        while True:
            page = await self.store.list_ledgers(after_id=after, limit=_LIST_PAGE)
            for record in page:
                yield record.value
            if len(page) < _LIST_PAGE:
                return
            after = page[-1].value.ledger_id

    # -- streams (pora/streams, docs/streams.md) -------------------------------------------

    async def create_stream(
        self,
        name: str,
        ensemble_size: int = 3,
        write_quorum: int = 3,
        ack_quorum: int = 2,
        segment_bytes_max: int = 256 << 20,
        segment_age_s_max: float = 3600,
        retention_s: float | None = None,
        retention_bytes: int | None = None,
        retention_s_max: float | None = None,
        retention_bytes_max: int | None = None,
        commit_keys_max: int = COMMIT_KEYS_MAX_DEFAULT,
        txn_idle_s_max: float = TXN_IDLE_S_MAX_DEFAULT,
        txn_pending_max: int = TXN_PENDING_MAX_DEFAULT,
        txn_segments_max: int = TXN_SEGMENTS_MAX_DEFAULT,
        app_ids_max: int = APP_IDS_MAX_DEFAULT,
    ) -> Stream:
        """A new, empty stream whose segments are ledgers with these quorums, rolled
        at `segment_bytes_max` (at least 64 KiB) or `segment_age_s_max` seconds.
        StreamExists when the name is taken; InvalidArgument for a bad name or value.
        `stream.trim()` applies the retention: `retention_s` / `retention_bytes` spare
        what a cursor needs, the hard limits `retention_s_max` / `retention_bytes_max`
        do not. Transactions: the stream keeps the `commit_keys_max` newest commit keys
        (1..10,000), and `collect_abandoned_transactions` removes those idle
        `txn_idle_s_max` seconds; it holds at most `txn_pending_max` pending
        transactions with `txn_segments_max` segments between them and records at most
        `app_ids_max` app ids (these four limits together are bounded by what the
        document keeps for them: InvalidArgument says which to lower)."""
        self._check_open("create a stream")
        config = StreamConfig(
            ensemble_size,
            write_quorum,
            ack_quorum,
            segment_bytes_max,
            segment_age_s_max,
            retention_s,
            retention_bytes,
            retention_s_max,
            retention_bytes_max,
            commit_keys_max,
            txn_idle_s_max,
            txn_pending_max,
            txn_segments_max,
            app_ids_max,
        )
        return await streams.create_stream(self, name, config)

    async def open_stream(self, name: str) -> Stream:
        """The stream named `name`; NoSuchStream when there is none."""
        self._check_open("open a stream")
        return await streams.open_stream(self, name)

    def list_streams(self) -> AsyncIterator[StreamInfo]:
        """Every stream's `StreamInfo`, by name."""
        self._check_open("list streams")
        return streams.list_streams(self)

    async def delete_stream(self, name: str) -> None:
        """Delete the stream (docs/streams.md, "Deleting a stream"): mark its record,
        fence and delete the ledgers its writers may append to, delete the record, then
        the rest, best effort. NoSuchStream when there is none; StreamDeleteFailed (the
        stream left marked, gone for every client) when a writer's ledger cannot be
        fenced: call it again. Once it returns no append of any writer started after
        it is acknowledged."""
        self._check_open("delete a stream")
        await deletion.delete_stream(self, name)

    async def _abandon_writers(self) -> None:
        """The client ends: every writer's pending appends fail, its readers' reads
        fail with ClientClosed from now on, the node calls stop."""
        self._closed = True
        for reader in list(self._readers):
            reader.client_closed()
        for writer in list(self._writers):
            await writer.abandon()
        self._node_calls.stop()


@asynccontextmanager
async def connect(
    url: str,
    config: ClientConfig | None = None,
    *,
    open_channel: ChannelOpener | None = None,
    rng: random.Random | None = None,
    metrics: CollectorRegistry | None = None,
) -> AsyncIterator[Client]:
    """A replicating client on the metadata store at `url` (`sqlite:...`, `zk://...`),
    for the block. `open_channel` replaces the TCP connections to the nodes (tests:
    in-process nodes); `rng` seeds placement's choices (a simulation replays them);
    `metrics`, a `prometheus_client.CollectorRegistry`, gets the client's metrics
    (`pora_client_*`, metrics.py; one client per registry).

    An error leaving the block comes out as itself (`except pora.NoSuchLedger` around
    the block catches it), not wrapped in the ExceptionGroup of the client's task
    group; errors that really happened together stay in their group.
    InvalidArgumentType for a URL that is not a str, MetadataUnavailable for one that
    names no store this build can open (unknown scheme, malformed host or port)."""
    url = check_url(url)
    config = config or ClientConfig()
    with lone_error_unwrapped():
        async with (
            # a client never sets up a store: a wrong URL is an error, not a new empty cluster
            open_metadata(url, config.metadata, create=False) as store,
            client_on_store(
                store,
                open_channel or tcp_channels(config.node_timeout_s, config.connect_timeout_s),
                config,
                rng or random.Random(),
                metrics,
            ) as client,
        ):
            yield client


def _client_closed(what: str) -> PoraError:
    """What the client's node pool raises once the client ended."""
    return ClientClosed(None, what)


@asynccontextmanager
async def client_on_store(
    store: MetadataStore,
    open_channel: ChannelOpener,
    config: ClientConfig,
    rng: random.Random,
    metrics: CollectorRegistry | None = None,
) -> AsyncIterator[Client]:
    """A client on a store already open, for the block (`connect`, and the simulation
    with its own store and channels): its task group, its node pool, and on the way out
    its writers abandoned and its connections closed."""
    async with anyio.create_task_group() as tasks:
        pool = NodePool(tasks, open_channel, closed_error=_client_closed)
        client = Client(store, pool, tasks, config, rng, metrics)
        try:
            yield client
        finally:
            with anyio.CancelScope(shield=True):
                await client._abandon_writers()
                await pool.aclose()


def _client_metrics(registry: CollectorRegistry, pending_bytes: Budget) -> ClientMetrics:
    """The client's metrics in `registry`; prometheus_client is imported only here, so
    a client without metrics never loads it."""
    from pora.client.replication.metrics import ClientMetrics  # noqa: PLC0415

    return ClientMetrics(registry, pending_bytes)
