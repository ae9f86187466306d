"""The add operations of the per-node client.

`add_entry` and `add_coalesced` queue their entries on the connection, to share
frames with every other add of the same scheduler turn (see pora.client.coalescer);
`add_batches_many` (several ledgers' batches as one caller, the replicating
writer's call per node) encodes its batches straight into frames (see
pora.client.ledger_frames); `add_run` sends one ADD_RUN frame; `add_entries` cuts
its entries into runs that fit a frame (pora.client.frame_cuts) and sends them
pipelined.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from journal.errors import PoraError
from ledger.errors import InvalidArgument
from netio import frames as f
from netio.codec import encode_add_run
from netio.errors import RequestTimeout
from pora.client.coalescer import AddCall, QueuedAdd
from pora.client.frame_cuts import RUN_FRAME_BASE, cut_frames
from pora.client.ledger_frames import BatchCall, Outcomes, encode_batches
from pora.client.node_channel import AddRequest
from pora.client.remote_errors import clone_error
from pora.client.requests import RequestClient
from pora.client.runs import run_outcomes
from pora.client.session import Session


class AddClient(RequestClient):
    """The adds of a `NodeClient`."""

    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """Store an entry on the node; returns once it is durable there.

        `password` (or an already derived `master_key`) must match the ledger's;
        `last_add_confirmed` piggybacks the writer's LAC for tail readers;
        `recovery` marks an add of a recovery, which a fenced ledger accepts.
        """
        key = master_key if password is None else self._key(master_key, password)
        session = self._session
        if session is None or not session.alive or self._room_waiters or self._busy(session):
            # connecting, or waiting in line for room: add_coalesced does both
            (outcome,) = await self.add_coalesced(
                ledger_id,
                [(entry_id, payload)],
                master_key=key,
                last_add_confirmed=last_add_confirmed,
                recovery=recovery,
                timeout_s=timeout_s,
            )
        else:
            # the common case, kept lean: one entry queued on a connection with room,
            # `_wait_for_adds` inlined (every coroutine level is resumed at each wake-up)
            timeout = self.timeout_s if timeout_s is None else timeout_s
            call = self._new_add_call(1, self._now() + timeout)
            session.add_queue.append(
                QueuedAdd(ledger_id, key, recovery, entry_id, payload, last_add_confirmed, call, 0)
            )
            size = len(payload)
            self._adds_in_flight += 1
            self._add_bytes_in_flight += size
            if self._sweeper_idle:
                self._wake_sweeper()
            ready = session.outbox_ready
            if not ready.is_set():
                ready.set()
            try:
                await call.wait()
            finally:
                self._adds_in_flight -= 1
                self._add_bytes_in_flight -= size
                if self._room_waiters:
                    self._grant_room(len(session.pending))
            if call.timed_out or call.error is not None:
                self._raise_failed(call, timeout)
            outcome = call.outcomes[0]
        if outcome is not None:
            raise outcome

    async def add_coalesced(
        self,
        ledger_id: int,
        entries: Sequence[tuple[int, bytes]],
        *,
        master_key: bytes = b"",
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> list[PoraError | None]:
        """Store `(entry_id, payload)` entries of one ledger, sharing frames with every
        other add queued on the connection in the same scheduler turn (ADD_RUN,
        ADD_BATCH or ADD_ENTRY frames; see pora.client.coalescer). One outcome per
        entry, in order: None (stored) or the error of that entry alone; a frame
        refused whole (a ledger refusal) gives each of its entries that error.
        Raises RequestTimeout or ConnectionLost (outcomes unknown: retrying with
        the same bytes is safe), and InstanceMismatch, sending nothing, when
        `instance_id` is given and the node answers from another instance."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        left_s = timeout
        session = self._session
        if session is None or not session.alive:
            session = await self._connected()
        if self._room_waiters or self._busy(session):
            left_s = await self._wait_for_room(timeout)
            session = await self._connected()
        if instance_id is not None:
            await self._check_instance(session, instance_id, left_s)
        count = len(entries)
        call = self._new_add_call(count, self._now() + left_s)
        queue = session.add_queue
        size = 0
        for index, (entry_id, payload) in enumerate(entries):
            size += len(payload)
            queue.append(
                QueuedAdd(
                    ledger_id,
                    master_key,
                    recovery,
                    entry_id,
                    payload,
                    last_add_confirmed,
                    call,
                    index,
                )
            )
        return await self._wait_for_adds(session, call, count, size, timeout)

    async def _wait_for_adds(
        self, session: Session, call: AddCall, count: int, size: int, timeout: float
    ) -> list[PoraError | None]:
        """Wait for the `count` entries (`size` payload bytes) of `call`, just queued
        on `session`: their outcomes, or RequestTimeout or the connection's loss."""
        self._adds_in_flight += count
        self._add_bytes_in_flight += size
        if self._sweeper_idle:
            self._wake_sweeper()
        ready = session.outbox_ready
        if not ready.is_set():
            ready.set()
        try:
            await call.wait()
        finally:
            self._adds_in_flight -= count
            self._add_bytes_in_flight -= size
            if self._room_waiters:
                self._grant_room(len(session.pending))
        if call.timed_out or call.error is not None:
            self._raise_failed(call, timeout)
        return call.outcomes

    def _raise_failed(self, call: AddCall | BatchCall, timeout: float) -> NoReturn:
        """Raise why `call` ended without outcomes: its timeout, or the connection's
        loss (each caller its own copy of the error)."""
        if call.timed_out:
            raise RequestTimeout(
                f"no response from node {self.address} within {timeout} s; the adds may "
                "or may not have been performed (retrying with the same bytes is safe)"
            )
        assert call.error is not None
        raise clone_error(call.error)

    async def add_batches_many(
        self,
        requests: Sequence[AddRequest],
        *,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> list[Outcomes]:
        """Several ledgers' batches as one caller, each batch one ledger's entries in
        increasing id order, encoded straight into frames (one per batch when it
        fits: see pora.client.ledger_frames): one wait (one event, one deadline) for
        all of them. One answer per request, in order: None when every entry of it
        was stored, else an outcome per entry as `add_coalesced` gives. Raises as
        `add_coalesced` (every request's outcomes unknown)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        left_s = timeout
        session = self._session
        if session is None or not session.alive:
            session = await self._connected()
        if self._room_waiters or self._busy(session):
            left_s = await self._wait_for_room(timeout)
            session = await self._connected()
        if instance_id is None:
            await self._await_identity(session, left_s)  # frames fit the node's limits
        else:
            await self._check_instance(session, instance_id, left_s)
        call = BatchCall(requests, self._now() + left_s, self._new_event())
        limit = min(self._frame_bytes_max, session.node_frame_bytes_max or self._frame_bytes_max)
        frames = encode_batches(call, self._new_id, limit, session.node_entry_bytes_max)
        if not frames:
            return call.answers
        pending = session.pending
        outbox = session.outbox
        for request_id, frame, batch_frame in frames:
            pending[request_id] = (batch_frame, 0)
            outbox.append(frame)
        call.remaining = len(frames)
        count = sum([len(request.entries) for request in requests])
        size = sum([len(frame) for _, frame, _ in frames])
        self._adds_in_flight += count
        self._add_bytes_in_flight += size
        if self._sweeper_idle:
            self._wake_sweeper()
        ready = session.outbox_ready
        if not ready.is_set():
            ready.set()
        try:
            await call.event.wait()
        finally:
            self._adds_in_flight -= count
            self._add_bytes_in_flight -= size
            if self._room_waiters:
                self._grant_room(len(session.pending))
        if call.timed_out or call.error is not None:
            self._raise_failed(call, timeout)
        return call.answers

    async def add_run(
        self,
        ledger_id: int,
        first_entry_id: int,
        payloads: Sequence[bytes],
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> list[PoraError | None]:
        """Store entries `first_entry_id`, `first_entry_id + 1`, ... with these payloads
        (1 to RUN_ENTRIES_MAX of them) in one ADD_RUN frame, answered by one response;
        returns once they are durable: one outcome per payload, in order (None: stored,
        else the engine's exception of an entry that failed alone, EntryConflict say).

        Raises the error that refused the whole run, when the node took none of it: a
        ledger refusal (Unauthorized, LedgerFenced, LedgerClosed, NodeReadOnly, ...)
        or one unfit entry (EntryTooLarge or InvalidArgument, its `entry_id` naming
        the entry). The frame must fit the node's frame_bytes_max, else the node
        refuses it with EntryTooLarge and drops the connection: `add_entries` cuts
        entries into runs that fit. Options as for `add_entry`.
        """
        count = len(payloads)
        if not 1 <= count <= f.RUN_ENTRIES_MAX:
            raise InvalidArgument(
                f"a run carries 1 to {f.RUN_ENTRIES_MAX} entries, got {count}; "
                "add_entries takes any number"
            )
        request_id = self._new_id()
        frame = encode_add_run(
            request_id,
            ledger_id,
            first_entry_id,
            payloads,
            master_key=self._key(master_key, password),
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
        )
        (result,) = await self._call([frame], [request_id], timeout_s)
        if isinstance(result, PoraError):
            raise result
        return run_outcomes(result, ledger_id, first_entry_id, count)

    async def add_entries(
        self,
        ledger_id: int,
        entries: Sequence[tuple[int, bytes]],
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> list[PoraError | None]:
        """Store many `(entry_id, payload)` of one ledger; one outcome per entry, in
        the order given (None: stored, else the engine's exception).

        Entries whose ids go up by one in the order given travel as one run: one
        ADD_RUN frame of up to RUN_ENTRIES_MAX entries, cut where the frame would
        pass this client's frame_bytes_max or the node's, if lower (asked with an
        INFO, under the same timeout, on a connection's first `add_entries`). Every
        frame is sent at once, pipelined. Sparse or unordered ids work, as shorter
        runs.

        A run is refused whole, each of its entries getting that error and none of
        them stored, by a ledger refusal (Unauthorized, LedgerFenced, ...) and by
        an unfit entry: one entry over the node's entry_bytes_max (EntryTooLarge)
        or with a bad id (InvalidArgument) refuses its whole run, the error's
        `entry_id` naming it. An entry too large for any frame goes alone, and the
        node refuses it with EntryTooLarge and drops the connection. Entries of a
        run fail alone when they are stored already with other bytes (EntryConflict).
        A timeout or a lost connection raises RequestTimeout or ConnectionLost, as
        for every call: then each entry may or may not be stored (retrying with the
        same bytes is safe).
        """
        if not entries:
            return []
        key = self._key(master_key, password)
        room = await self._frame_limit(timeout_s) - RUN_FRAME_BASE - len(key)
        runs = cut_frames(
            [entry_id for entry_id, _ in entries],
            [len(payload) for _, payload in entries],
            room,
            runs=True,
            entry_bytes_max=None,  # (an unfit entry refuses its run, as documented)
        )
        request_ids = self._ids(len(runs))
        frames = [
            encode_add_run(
                request_id,
                ledger_id,
                entries[start][0],
                [payload for _, payload in entries[start:stop]],
                master_key=key,
                last_add_confirmed=last_add_confirmed,
                recovery=recovery,
            )
            for request_id, (start, stop) in zip(request_ids, runs, strict=True)
        ]
        results = await self._call(frames, request_ids, timeout_s)
        outcomes: list[PoraError | None] = []
        for result, (start, stop) in zip(results, runs, strict=True):
            outcomes += run_outcomes(result, ledger_id, entries[start][0], stop - start)
        return outcomes

    async def _frame_limit(self, timeout_s: float | None) -> int:
        """The size runs are packed to: this client's frame_bytes_max, or the node's
        if it is lower (its answer to the connection's first request, an INFO)."""
        session = await self._connected()
        await self._await_identity(session, self.timeout_s if timeout_s is None else timeout_s)
        return min(self._frame_bytes_max, session.node_frame_bytes_max or self._frame_bytes_max)


__all__ = ["AddClient"]
