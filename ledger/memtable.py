"""A ledger's memtable: entries not yet in its entry log, plus recent ones for tail reads.

Three generations, all owned by the ledger's worker:

- `unflushed`: applied, journalled, not yet in the entry log;
- `flushing`: handed to the flush in progress (still served to reads until the
  index knows where they are);
- `recent`: already flushed, kept (bounded in bytes) so tail readers are served
  from memory.

Every generation holds record bodies as the journal made them: moving an entry
from one generation to the next copies nothing. Replay's bodies are views of the
journal segment it read (journal/records.py): they stay views while unflushed or
flushing (the journal keeps a segment until every ledger's entries in it are
flushed), and are not kept as recent, which outlives the flush. A view keeps the
whole segment mapped, and the segment's file would go on taking disk space after
its trim, or be recycled and rewritten under the view (journal/spares.py).

Node-wide, every memtable's unflushed bytes are summed in one `MemoryBudget`, so
the node's memory has a ceiling whatever the number of ledgers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from journal.format import BODY_HEADER_SIZE, RecordBody

#: an entry's record body as journalled (made by the request, read back from an
#: entry log, or a view of a journal segment that replay read)
Body: TypeAlias = RecordBody


class MemoryBudget:
    """Unflushed bytes across all memtables of a node (single-threaded: trio)."""

    __slots__ = ("limit_bytes", "unflushed_bytes")

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.unflushed_bytes = 0

    @property
    def exceeded(self) -> bool:
        return self.unflushed_bytes > self.limit_bytes


class Memtable:
    """One ledger's entries in memory, in three generations.

    Each entry is its record body as journalled (an entry-log record: header and
    payload), so the flush can write it as it is; a read slices the payload out.
    """

    __slots__ = (
        "_budget",
        "_flushing_bytes",
        "_flushing_views",
        "_recent",
        "_recent_bytes",
        "_recent_bytes_max",
        "_unflushed_last_id",
        "_unflushed_views",
        "flushing",
        "flushing_in_order",
        "unflushed",
        "unflushed_bytes",
        "unflushed_in_order",
    )

    def __init__(self, budget: MemoryBudget, recent_bytes_max: int) -> None:
        self._budget = budget
        self.unflushed: dict[int, Body] = {}
        self.unflushed_bytes = 0
        #: whether `unflushed` iterates in entry-id order (appends, the common case):
        #: the flush, which writes in entry-id order, then need not sort
        self.unflushed_in_order = True
        self._unflushed_last_id = -1
        #: whether a generation may hold views of journal segments (replayed bodies)
        self._unflushed_views = False
        self._flushing_views = False
        self.flushing: dict[int, Body] = {}
        self.flushing_in_order = True
        self._flushing_bytes = 0
        self._recent: dict[int, Body] = {}
        self._recent_bytes = 0
        self._recent_bytes_max = recent_bytes_max

    def replaying(self) -> None:
        """The entries put next may be replay's views of journal segments."""
        self._unflushed_views = True

    def put(self, entry_id: int, body: Body) -> None:
        if entry_id <= self._unflushed_last_id:
            self.unflushed_in_order = False
        else:
            self._unflushed_last_id = entry_id
        replaced = self.unflushed.get(entry_id)
        self.unflushed[entry_id] = body
        added = len(body) - (0 if replaced is None else len(replaced))
        self.unflushed_bytes += added
        self._budget.unflushed_bytes += added

    def put_many(self, entry_ids: Sequence[int], bodies: Sequence[Body]) -> int:
        """`put` for many entries at once (dict, map and sum work in C); returns their bytes.
        `entry_ids` ascend (a run) and none is held yet."""
        if entry_ids:
            if entry_ids[0] <= self._unflushed_last_id:
                self.unflushed_in_order = False
            self._unflushed_last_id = max(self._unflushed_last_id, entry_ids[-1])
        self.unflushed.update(zip(entry_ids, bodies, strict=True))
        added = sum(map(len, bodies))
        self.unflushed_bytes += added
        self._budget.unflushed_bytes += added
        return added

    def get(self, entry_id: int) -> bytes | None:
        """The payload of `entry_id`, if held."""
        body = self.unflushed.get(entry_id)
        if body is None:
            body = self.flushing.get(entry_id)
            if body is None:
                body = self._recent.get(entry_id)
                if body is None:
                    return None
        return bytes(memoryview(body)[BODY_HEADER_SIZE:])

    def items_between(self, first: int, last: int) -> dict[int, bytes]:
        """Payloads of the held entries with ids in [first, last]."""
        found: dict[int, bytes] = {}
        for generation in (self._recent, self.flushing, self.unflushed):
            for entry_id, body in generation.items():
                if first <= entry_id <= last:
                    found[entry_id] = bytes(memoryview(body)[BODY_HEADER_SIZE:])
        return found

    def begin_flush(self) -> dict[int, Body]:
        """Move the unflushed entries to the flushing generation and return them."""
        assert not self.flushing, "one flush at a time per ledger"
        self.flushing, self.unflushed = self.unflushed, {}
        self.flushing_in_order = self.unflushed_in_order
        self.unflushed_in_order = True
        self._flushing_views, self._unflushed_views = self._unflushed_views, False
        self._unflushed_last_id = -1
        self._budget.unflushed_bytes -= self.unflushed_bytes
        self._flushing_bytes = self.unflushed_bytes
        self.unflushed_bytes = 0
        return self.flushing

    def end_flush(self) -> None:
        """The flushing entries are in the entry log and indexed: keep some as recent."""
        flushing, self.flushing = self.flushing, {}
        limit = self._recent_bytes_max
        recent = self._recent
        flushed_bytes = self._flushing_bytes
        self._flushing_bytes = 0
        if self._flushing_views:
            # replayed bodies: the reads go to the entry log (see the module docstring)
            self._flushing_views = False
            return
        if flushed_bytes >= limit // 2:
            # the new tail alone fills (most of) the budget: it replaces the old one
            recent.clear()
            self._recent_bytes = 0
        # dicts keep insertion order, which is journal order: the oldest go first
        if flushed_bytes <= limit:
            recent.update(flushing)
            self._recent_bytes += flushed_bytes
        else:  # only the newest that fit: walk back from the end
            kept: list[int] = []
            kept_bytes = 0
            for entry_id in reversed(flushing):
                size = len(flushing[entry_id])
                if kept_bytes + size > limit:
                    break
                kept.append(entry_id)
                kept_bytes += size
            for entry_id in reversed(kept):
                recent[entry_id] = flushing[entry_id]
            self._recent_bytes += kept_bytes
        while self._recent_bytes > limit and recent:
            oldest = next(iter(recent))
            self._recent_bytes -= len(recent.pop(oldest))

    def abort_flush(self) -> None:
        """The flush failed: its entries become unflushed again (the journal still has them)."""
        for entry_id, body in self.flushing.items():
            if entry_id not in self.unflushed:
                self.put(entry_id, body)
        self._unflushed_views = self._unflushed_views or self._flushing_views
        self.flushing = {}
        self._flushing_bytes = 0
        self._flushing_views = False

    def clear(self) -> None:
        """Forget everything (the ledger was deleted)."""
        self._budget.unflushed_bytes -= self.unflushed_bytes
        self.unflushed = {}
        self.unflushed_bytes = 0
        self.flushing = {}
        self._flushing_bytes = 0
        self._unflushed_views = self._flushing_views = False
        self.unflushed_in_order = True
        self._unflushed_last_id = -1
        self._recent = {}
        self._recent_bytes = 0

    @property
    def resident_bytes(self) -> int:
        """Bytes held, all generations (bodies include their record headers)."""
        return self.unflushed_bytes + self._flushing_bytes + self._recent_bytes
