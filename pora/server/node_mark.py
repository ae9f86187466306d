"""The node instance's mark in the metadata store (R27): the one owner of it.

The mark is how far the instance's journal was durable, as the store last
acknowledged it; a data dir put back from a copy behind it starts as a new instance
(membership.py). `NodeMark` raises it for three callers: the registrar's renewals
and its stop (`advance`: to the journal's position now), and fences (`cover`: a node
answers a fence only once the mark is past the record that fenced the ledger, so a
copy that lacks the fence is caught when put back).

Writes are one at a time. A fence that finds the mark past its record costs nothing;
fences that arrive while a write is under way wait for it and share the next one
(each write takes the journal's position when it starts, which covers every fence
answered by then). If a write fails, every fence that waited for it fails with
`FenceNotRecorded` (the recovering client retries or fences another member) and the
next fence tries the store again. Appends never wait here.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from netio.errors import NodeOverloaded
from pora.meta.errors import MetadataError
from pora.meta.store import MetadataStore


class FenceNotRecorded(NodeOverloaded):
    """The node fenced the ledger but could not raise its mark in the metadata store
    over the fence: it does not answer the fence as done (the client tries again)."""


class NodeMark:
    def __init__(
        self,
        store: MetadataStore,
        instance_id: str,
        journal_position: Callable[[], int],
        mark: int | None = None,
    ) -> None:
        self.store = store
        self.instance_id = instance_id
        #: every journal record below this seq is durable; it only grows
        self.journal_position = journal_position
        #: the last mark the store acknowledged for this instance
        self.mark = mark
        #: failed writes, for metrics and logs
        self.failures = 0
        #: writes made for fences (the renewals' are not counted)
        self.fence_writes = 0
        self._write_lock = trio.Lock()
        self._writes_started = 0
        #: the number of the last write that failed, and why
        self._last_failure: tuple[int, MetadataError] | None = None

    def covers(self, position: int) -> bool:
        return self.mark is not None and self.mark >= position

    async def advance(self) -> None:
        """Raise the mark to the journal's position now (MetadataError if the store
        refused): a copy of the data dir taken before this is behind it."""
        await self._raise_to(self.journal_position(), for_fence=False)

    async def cover(self, position: int) -> None:
        """Return once the mark is at or past `position` (the journal position a
        fence record lies below); FenceNotRecorded if the store could not be written."""
        if self.covers(position):
            return
        try:
            await self._raise_to(position, for_fence=True)
        except MetadataError as error:
            raise FenceNotRecorded(
                f"the fence is journalled, but node instance {self.instance_id} cannot "
                f"record it in the metadata store {self.store.url} ({error}); a node "
                "answers a fence only once its mark is past it: retry, or fence the "
                "ledger's other members"
            ) from None

    async def _raise_to(self, position: int, *, for_fence: bool) -> None:
        waited_from = self._writes_started
        async with self._write_lock:
            if self.covers(position):
                return  # a write made while this one waited covered it
            failure = self._last_failure
            if for_fence and failure is not None and failure[0] > waited_from:
                # the write this fence waited for failed: so does the fence, at once,
                # rather than a queue of fences each waiting out the store's timeout
                raise failure[1]
            target = max(position, self.journal_position())
            self._writes_started += 1
            number = self._writes_started
            try:
                await self.store.advance_node_mark(self.instance_id, target)
            except MetadataError as error:
                self.failures += 1
                self._last_failure = (number, error)
                raise
            if for_fence:
                self.fence_writes += 1
            self.mark = target
