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
    """Made before the node (whose fences it holds: `open_node(fence_barrier=
    mark.cover)`), started once the data dir is checked against the store
    (membership.py `start_mark`); a fence that comes before the start waits for it."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        #: the instance whose mark this is; None until `start`
        self.instance_id: str | None = None
        #: every journal record below this seq is durable; it only grows
        self._journal_position: Callable[[], int] | None = None
        #: the last mark the store acknowledged for this instance
        self.mark: int | None = None
        #: failed writes, for metrics and logs
        self.failures = 0
        #: writes made for fences (the renewals' are not counted)
        self.fence_writes = 0
        self._started = trio.Event()
        self._write_lock = trio.Lock()
        self._writes_started = 0
        #: the number of the last write that failed, and why
        self._last_failure: tuple[int, MetadataError] | None = None

    def start(
        self, instance_id: str, journal_position: Callable[[], int], mark: int | None
    ) -> None:
        """The node serves as `instance_id`, whose mark the store holds as `mark`
        (`start_mark` wrote it when it checked the data dir; None: none yet)."""
        if self.instance_id is not None:
            raise RuntimeError(f"the mark of node instance {self.instance_id} is started already")
        self.instance_id = instance_id
        self._journal_position = journal_position
        self.mark = mark
        self._started.set()

    def covers(self, position: int) -> bool:
        return self.mark is not None and self.mark >= position

    async def advance(self) -> None:
        """Raise the mark to the journal's position now (MetadataError if the store
        refused): a copy of the data dir taken before this is behind it."""
        await self._raise_to(self._position(), for_fence=False)

    async def cover(self, position: int) -> None:
        """Return once the mark is at or past `position` (the journal position a
        fence record lies below); FenceNotRecorded if the store could not be written.
        Before `start` it waits for the start (which writes the mark the node starts
        from, past every fence the node journalled by then)."""
        await self._started.wait()
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
            target = max(position, self._position())
            self._writes_started += 1
            number = self._writes_started
            try:
                await self.store.advance_node_mark(self._instance(), target)
            except MetadataError as error:
                self.failures += 1
                self._last_failure = (number, error)
                raise
            if for_fence:
                self.fence_writes += 1
            self.mark = target

    def _instance(self) -> str:
        if self.instance_id is None:
            raise RuntimeError("the node's mark is used before `start`")
        return self.instance_id

    def _position(self) -> int:
        if self._journal_position is None:
            raise RuntimeError("the node's mark is used before `start`")
        return self._journal_position()
