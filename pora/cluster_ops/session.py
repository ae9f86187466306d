"""The cluster tools' runs: a store and a pool of node connections for the run, and
the loops of `pora audit`, `pora rereplicate [--watch]` and `pora node decommission`
(docs/rereplication.md)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from pora.client.lone_errors import lone_error_unwrapped
from pora.client.node_pool import NodePool, tcp_channels
from pora.client.replication.config import ClientConfig
from pora.client.replication.replica_reads import ChannelFor
from pora.cluster_ops.audit import AuditReport, audit
from pora.cluster_ops.fragments import DRAINING, MISSING_ENTRIES, LostMember, fragments_of
from pora.cluster_ops.inventory import all_ledgers, mark_draining, unmark_draining
from pora.cluster_ops.worker import Report, Rereplicator, Totals, WorkerOptions
from pora.meta.backends import open_metadata
from pora.meta.records import EnsembleMember
from pora.meta.store import MetadataStore


@dataclass(frozen=True)
class Cluster:
    store: MetadataStore
    channel_for: ChannelFor
    config: ClientConfig


@asynccontextmanager
async def cluster_session(url: str, config: ClientConfig | None = None) -> AsyncIterator[Cluster]:
    """The store at `url` (never created: a wrong URL is an error) and connections to
    the nodes, opened on first use, for the block."""
    config = config or ClientConfig()
    # the group's own tasks (the connections' holders) end without raising: an error
    # leaving the block comes out as itself
    with lone_error_unwrapped():
        async with (
            open_metadata(url, config.metadata, create=False) as store,
            anyio.create_task_group() as tasks,
        ):
            pool = NodePool(tasks, tcp_channels(config.node_timeout_s, config.connect_timeout_s))
            try:
                yield Cluster(store, pool.channel, config)
            finally:
                with anyio.CancelScope(shield=True):
                    await pool.aclose()


async def audit_cluster(cluster: Cluster, deep: bool) -> AuditReport:
    return await audit(
        cluster.store, deep=deep, channel_for=cluster.channel_for, config=cluster.config
    )


async def rereplicate(
    cluster: Cluster,
    options: WorkerOptions,
    report: Report,
    on_worker: Callable[[Rereplicator], None] = lambda _: None,
) -> Totals:
    """One run: every lost member repaired (or reported), then the open ledgers that
    waited for their grace (A10)."""
    worker = Rereplicator(cluster.store, cluster.channel_for, cluster.config, options, report)
    on_worker(worker)
    await worker.run_once()
    await worker.wait_for_open_ledgers()
    return worker.totals


class LostClock:
    """A13: since when (this process's monotonic clock) each member has been seen lost;
    one that is found again is forgotten, so a restart within the delay costs nothing."""

    def __init__(self, lost_after_s: float) -> None:
        self._lost_after_s = lost_after_s
        self._since: dict[EnsembleMember, float] = {}
        self._seen: set[EnsembleMember] = set()

    def ready(self, lost: LostMember) -> bool:
        if lost.why in (DRAINING, MISSING_ENTRIES):
            return True  # the node is there: nothing to wait for
        now = time.monotonic()
        self._seen.add(lost.member)
        return now - self._since.setdefault(lost.member, now) >= self._lost_after_s

    def round_done(self) -> None:
        self._since = {m: t for m, t in self._since.items() if m in self._seen}
        self._seen = set()


async def watch(
    cluster: Cluster, options: WorkerOptions, report: Report, lost_after_s: float, interval_s: float
) -> None:
    """A13: rounds until cancelled; a member lost longer than `lost_after_s` is
    repaired, open ledgers after their grace."""
    worker = Rereplicator(cluster.store, cluster.channel_for, cluster.config, options, report)
    clock = LostClock(lost_after_s)
    while True:
        await worker.run_once(clock.ready)
        clock.round_done()
        await anyio.sleep(interval_s)


@dataclass
class DrainState:
    address: str
    #: (ledger id, first entry of the fragment) still naming the node
    fragments_left: list[tuple[int, int]]

    @property
    def done(self) -> bool:
        return not self.fragments_left


async def fragments_on(store: MetadataStore, address: str) -> list[tuple[int, int]]:
    found = []
    async for versioned in all_ledgers(store):
        for fragment in fragments_of(versioned.value):
            if any(m.address == address for m in fragment.ensemble.members):
                found.append((versioned.value.ledger_id, fragment.first_entry_id))
    return found


async def decommission(
    cluster: Cluster, address: str, options: WorkerOptions, report: Report
) -> DrainState:
    """A14: mark the node draining, repair every fragment it holds, and say which
    still name it (none: it may be stopped)."""
    await mark_draining(cluster.store, address, options.holder, int(time.time() * 1000))
    await rereplicate(cluster, options, report)
    return DrainState(address, await fragments_on(cluster.store, address))


async def undo_decommission(cluster: Cluster, address: str) -> bool:
    return await unmark_draining(cluster.store, address)
