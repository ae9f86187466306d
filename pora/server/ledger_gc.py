"""The node's garbage collection: deleting, in the background and throttled, the
ledgers this node stores that the cluster's metadata store no longer knows.

Such ledgers are left by a delete while the node was down or unreachable (the
client's delete is best effort on each node), a create whose writer died before its
record was written, or the ledgers of a stream's transaction that `pora stream gc`
removed from the store. Nothing else would ever reclaim their space.

The rules (docs/operations.md, "Garbage collection on nodes"):

1. Only a ledger created on this node more than `grace_s` ago is a candidate: a
   writer may still be about to record a ledger it just made.
2. A pass walks the node's ledgers and the store's listing side by side, by id,
   page by page (bounded memory); a ledger missing from the listing is a candidate,
   and its record is read again right before it is deleted: a stale listing alone
   never deletes anything. A record found, in any state, spares the ledger.
3. The pass first checks that the store still holds the cluster id the data dir
   joined: a wiped or replaced store (which would know no ledger) deletes nothing.
4. Any failure to read the store (unreachable, timed out, its file gone) ends the
   pass with nothing more deleted; the next pass, an interval later, starts over.
5. At most `deletions_per_s` deletions a second; each is logged (ledger id, when
   the node created it, its entries and bytes) and counted in the metrics.

A deletion is the node's own durable delete (`Node.collect_ledger`): the ledger's
entries go and a tombstone refuses its id from then on.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final

import trio

from journal.errors import PoraError
from ledger.errors import NoSuchLedger
from ledger.state import LedgerInfo
from pora.meta.errors import MetadataError, NoSuchLedgerMetadata
from pora.meta.records import LedgerMetadata, Versioned
from pora.meta.store import MetadataStore
from pora.node.node import Node

_log = logging.getLogger("pora.ledger_gc")

#: node ledgers and store records taken per page
PAGE_SIZE: Final = 500
#: above every ledger id
ID_END: Final = 2**63


@dataclass(frozen=True, slots=True)
class LedgerGcConfig:
    #: seconds between the starts of two passes (the first starts at once)
    interval_s: float = 600.0
    #: deletions a second at most
    deletions_per_s: float = 20.0
    #: a ledger created on this node less than this long ago is never collected
    grace_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("interval_s", "deletions_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"ledger_gc_{name} must be a finite number > 0, got {value}")
        if not (math.isfinite(self.grace_s) and self.grace_s >= 0):
            raise ValueError(f"ledger_gc_grace_s must be a finite number >= 0, got {self.grace_s}")


@dataclass(slots=True)
class LedgerGcStatistics:
    """For metrics: what the collector did since the node started."""

    passes: int = 0
    #: passes cut short because the store could not be read (or was another cluster's)
    passes_skipped: int = 0
    ledgers_deleted: int = 0
    bytes_deleted: int = 0
    #: deletions the node refused (the ledger changed under it), logged
    delete_failures: int = 0
    #: wall-clock seconds of the last pass that ran to its end (None: none yet)
    last_pass_end_s: float | None = None


class _PassStopped(Exception):
    """The pass cannot go on safely (the store is unreadable or another cluster's)."""


class LedgerCollector:
    def __init__(
        self,
        node: Node,
        store: MetadataStore,
        cluster_id: str,
        config: LedgerGcConfig,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._node = node
        self._store = store
        self._cluster_id = cluster_id
        self._config = config
        self._wall_clock = wall_clock
        self.statistics = LedgerGcStatistics()

    async def run(self) -> None:
        """Pass after pass, `interval_s` apart, until cancelled."""
        while True:
            started = trio.current_time()
            await self.collect()
            await trio.sleep_until(started + self._config.interval_s)

    async def collect(self) -> int:
        """One pass; returns how many ledgers it deleted."""
        self.statistics.passes += 1
        deleted = 0
        try:
            await self._check_cluster()
            async for info in self._unknown_candidates():
                if await self._delete_if_unknown(info):
                    deleted += 1
                    await trio.sleep(1 / self._config.deletions_per_s)
        except _PassStopped as stopped:
            self.statistics.passes_skipped += 1
            _log.warning(
                "ledger garbage collection paused until the next pass (%.0f s): %s",
                self._config.interval_s,
                stopped,
                extra={"fields": {"deleted_this_pass": deleted}},
            )
            return deleted
        self.statistics.last_pass_end_s = self._wall_clock()
        if deleted:
            _log.info(
                "ledger garbage collection deleted %d ledger(s)",
                deleted,
                extra={"fields": {"deleted": deleted}},
            )
        return deleted

    async def _check_cluster(self) -> None:
        try:
            found = await self._store.cluster_id()
        except MetadataError as error:
            raise _PassStopped(f"the metadata store {self._store.url}: {error}") from error
        if found != self._cluster_id:
            raise _PassStopped(
                f"the metadata store {self._store.url} holds cluster id {found}, not "
                f"{self._cluster_id} which this data dir joined: a wiped or replaced "
                "store knows no ledger, so nothing is deleted on its word"
            )

    async def _unknown_candidates(self) -> AsyncIterator[LedgerInfo]:
        """The node's ledgers past the grace that the store's listing lacks, by id.
        The listing is read from just below each candidate region on, so a node that
        holds a small part of a large cluster skips the ledgers it has none of."""
        grace_end_ms = (self._wall_clock() - self._config.grace_s) * 1000
        #: ids of the store's records from the last listing page, which covers every
        #: id from where it started up to `covered_to` (all above, when not full)
        listed: set[int] = set()
        covered_to = -1
        after = -1
        while page := self._node.ledgers(after_ledger_id=after, count_max=PAGE_SIZE):
            after = page[-1].ledger_id
            for info in page:
                if info.created_ms > grace_end_ms:
                    continue
                ledger_id = info.ledger_id
                if ledger_id > covered_to:
                    records = await self._listing_from(ledger_id)
                    listed = {record.value.ledger_id for record in records}
                    full = len(records) == PAGE_SIZE
                    covered_to = records[-1].value.ledger_id if full else ID_END
                if ledger_id not in listed:
                    yield info

    async def _listing_from(self, ledger_id: int) -> list[Versioned[LedgerMetadata]]:
        try:
            return await self._store.list_ledgers(ledger_id - 1, PAGE_SIZE)
        except MetadataError as error:
            raise _PassStopped(f"the metadata store {self._store.url}: {error}") from error

    async def _delete_if_unknown(self, info: LedgerInfo) -> bool:
        """Read the ledger's record once more; delete the node's copy if there is
        none. True when it was deleted."""
        ledger_id = info.ledger_id
        try:
            await self._store.read_ledger(ledger_id)
        except NoSuchLedgerMetadata:
            pass
        except MetadataError as error:
            raise _PassStopped(f"the metadata store {self._store.url}: {error}") from error
        else:
            return False  # recorded since the listing: it is the cluster's
        try:
            await self._node.collect_ledger(ledger_id)
        except NoSuchLedger:
            return False  # deleted meanwhile (a client's delete reached the node)
        except PoraError as error:
            self.statistics.delete_failures += 1
            _log.error(
                "ledger garbage collection could not delete ledger %d: %s",
                ledger_id,
                error,
                extra={"fields": {"ledger_id": ledger_id, "error": type(error).__name__}},
            )
            return False
        self.statistics.ledgers_deleted += 1
        self.statistics.bytes_deleted += info.payload_bytes
        created = datetime.datetime.fromtimestamp(info.created_ms / 1000, tz=datetime.UTC)
        _log.warning(
            "deleted ledger %d: the metadata store %s has no record of it (created on "
            "this node %s, %d entries, %d bytes)",
            ledger_id,
            self._store.url,
            created.isoformat(timespec="seconds"),
            info.entry_count,
            info.payload_bytes,
            extra={
                "fields": {
                    "ledger_id": ledger_id,
                    "created_ms": info.created_ms,
                    "entries": info.entry_count,
                    "payload_bytes": info.payload_bytes,
                }
            },
        )
        return True
