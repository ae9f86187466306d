"""The admission and execution of a connection's requests.

A `RequestExecutor` admits each batch the reader hands it: adds and runs become
journal requests of the node, submitted as ONE list (their completions go to the
writer); other operations (reads that may long-poll, fences, closes, ...) run as
tasks of the connection, so responses go out in completion order, matched by
request id. Past the node-wide limit of requests in flight a request is answered
OVERLOADED at once.

It owns the count of requests in the node (`ServerCounters.inflight`, one count
for every connection): it admits requests under `inflight_node_max` and takes
them off when the node completes them. It is built with what it touches: the
node, the config, the server's counters, the connection's `InFlight` (the bytes
of what it admits), its `ReadBytes` (reads reserve their responses' bytes
there), its `LongPolls`, the writer it queues responses on, and the connection's
nursery its requests other than adds run in.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import trio

import pora
from journal.errors import PoraError
from journal.request import Request
from ledger.errors import EntryConflict, NodeClosed, NoSuchEntry, NoSuchLedger, StorageCorruption
from netio import frames
from netio.codec import RequestDecoder, encode_error, encode_response
from netio.frames import Opcode, Status
from netio.messages import (
    AddBatch,
    AddBatchResponse,
    AddEntry,
    AddRun,
    Close,
    CloseResponse,
    Delete,
    DeleteResponse,
    Fence,
    FenceResponse,
    Info,
    InfoResponse,
    LacResponse,
    LedgerSummary,
    ListLedgers,
    ListLedgersResponse,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadRange,
    ReadRangeResponse,
    Refused,
    RequestMessage,
    ResponseMessage,
    WireAdd,
    WriteLac,
    WriteLacResponse,
)
from netio.status import status_of
from pora.node.node import Node
from pora.server.config import ServerConfig
from pora.server.counters import ServerCounters
from pora.server.in_flight import InFlight, ReadBytes
from pora.server.writer import ResponseWriter, error_frame

_log = logging.getLogger("pora.server")

#: what a long poll answers with
_T = TypeVar("_T")

#: the protocol version whose READ_LAC long-polls and answers the last entry id
_V4: Final = 4

#: Longest long poll a read may ask for; longer waits are cut to this.
LONG_POLL_MS_MAX: Final = 60_000
#: Most entries one READ_RANGE response carries.
RANGE_ENTRIES_MAX: Final = 10_000
#: Most ledgers one LIST_LEDGERS response carries.
LIST_LEDGERS_MAX: Final = 10_000
#: Bytes of a READ_ENTRY response besides its payload.
ENTRY_RESPONSE_OVERHEAD: Final = frames.HEADER_BYTES + frames.READ_ENTRY_RESPONSE.size

_OPCODES: Final[dict[type, int]] = {
    AddEntry: Opcode.ADD_ENTRY,
    AddRun: Opcode.ADD_RUN,
    AddBatch: Opcode.ADD_BATCH,
    WriteLac: Opcode.WRITE_LAC,
    ReadEntry: Opcode.READ_ENTRY,
    ReadRange: Opcode.READ_RANGE,
    ReadLac: Opcode.READ_LAC,
    Fence: Opcode.FENCE,
    Close: Opcode.CLOSE,
    Delete: Opcode.DELETE,
    ListLedgers: Opcode.LIST_LEDGERS,
    Info: Opcode.INFO,
}


def _log_corruption(message: RequestMessage, error: StorageCorruption) -> None:
    """Say where a read met damaged data: the client is told too, but the operator
    must learn of it to repair the node (docs/operations.md)."""
    if isinstance(message, ReadRange):
        entries = f"entries {message.first_entry_id}..{message.last_entry_id}"
    else:
        entries = f"entry {getattr(message, 'entry_id', -1)}"
    _log.error(
        "corrupt data met reading ledger %d %s: file %s, offset %d: %s; answered CORRUPT. "
        "Read the entry from another replica; run `pora verify` on the stopped node",
        getattr(message, "ledger_id", -1),
        entries,
        error.path,
        error.offset,
        error.reason,
    )


class _Held:
    """The read-response bytes one request has reserved."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class LongPolls:
    """The long-poll reads of one connection waiting now, and whether it stops:
    shutdown ends them at once (they could wait a minute; their clients can retry
    elsewhere) so that the drain is quick."""

    __slots__ = ("scopes", "stopping")

    def __init__(self) -> None:
        self.scopes: set[trio.CancelScope] = set()
        self.stopping = False

    def stop(self) -> None:
        self.stopping = True
        for scope in self.scopes:
            scope.cancel()


class RequestExecutor:
    """Admits and performs the requests of one connection."""

    def __init__(
        self,
        node: Node,
        config: ServerConfig,
        counters: ServerCounters,
        *,
        in_flight: InFlight,
        read_bytes: ReadBytes,
        long_polls: LongPolls,
        writer: ResponseWriter,
        decoder: RequestDecoder,
        nursery: trio.Nursery,
    ) -> None:
        self.node = node
        self.config = config
        self.counters = counters
        self.in_flight = in_flight
        self.read_bytes = read_bytes
        self.long_polls = long_polls
        self.writer = writer
        #: the reader's decoder, read here for the protocol version only
        self.decoder = decoder
        #: the connection's tasks: requests other than adds run here
        self.nursery = nursery
        # one bound method for every add and run (the node calls them on completion)
        self.on_add_done = self._on_add_done
        self.on_run_done = self._on_run_done

    @property
    def version(self) -> int:
        """The protocol version of the connection's requests, and so of its answers."""
        return self.decoder.version or frames.PROTOCOL_VERSION

    def _encode(self, message: ResponseMessage) -> bytes:
        return encode_response(message, self.version)

    def _on_add_done(self, request: Request) -> None:
        # runs in a ledger worker. The node-wide count drops at completion, not when
        # the response is sent: the connection may be gone by then
        self.counters.inflight -= len(request.tags)
        self.writer.add_done(request)

    def _on_run_done(self, request: Request) -> None:
        self.counters.inflight -= 1
        self.writer.run_done(request)

    async def dispatch(self, requests: list[RequestMessage | WireAdd | Refused]) -> None:
        counters = self.counters
        node = self.node
        counts = counters.requests_by_opcode
        room = self.config.inflight_node_max - counters.inflight
        adds: list[WireAdd] = []
        runs: list[Request] = []
        for message in requests:
            if type(message) is tuple:
                adds.append(message)
                continue
            assert not isinstance(message, tuple)  # (for the type checker)
            if isinstance(message, Refused):
                counts[message.opcode] += 1
                self._refuse(message)
                continue
            if type(message) is AddRun:
                counts[Opcode.ADD_RUN] += 1
                if room <= 0:
                    self._overloaded(message.request_id, Opcode.ADD_RUN)
                    continue
                run = self._run_request(message)
                if run is not None:
                    room -= 1
                    runs.append(run)
                continue
            opcode = _OPCODES[type(message)]
            counts[opcode] += 1
            if room <= 0:
                self._overloaded(message.request_id, opcode)
                continue
            room -= 1
            counters.inflight += 1
            self.nursery.start_soon(self._perform, message, opcode)
        if runs:
            counters.inflight += len(runs)
            self.in_flight.bytes += sum([run.payload_bytes for run in runs])
        batch = runs
        if adds:
            add_batch = self._add_requests(adds, room)
            batch = add_batch + runs if runs else add_batch
        if not batch:
            return
        try:
            await node.submit(batch)
        except PoraError as error:  # the node is closing: none of them was queued
            for request in batch:
                request.fail(error)

    def _add_requests(self, adds: list[WireAdd], room: int) -> list[Request]:
        """The node's requests for the adds of one read, those past the node-wide
        limit (`room` left) answered OVERLOADED and those the node refuses answered
        with their error."""
        counters = self.counters
        counters.requests_by_opcode[Opcode.ADD_ENTRY] += len(adds)
        if len(adds) > room:  # past the node-wide limit: refuse the rest
            for add in adds[max(room, 0) :]:
                self._overloaded(add[0], Opcode.ADD_ENTRY)
            adds = adds[: max(room, 0)]
        add_batch, refused = self.node.entry_requests(adds, self.on_add_done)
        for request_id, error in refused:
            self.writer.queue(error_frame(request_id, Opcode.ADD_ENTRY, error, self.version), 1)
        counters.inflight += len(adds) - len(refused)
        self.in_flight.bytes += sum([request.payload_bytes for request in add_batch])
        return add_batch

    def _refuse(self, message: Refused) -> None:
        """Answer a frame the decoder refused by itself (it never reaches the node)."""
        frame = encode_error(
            message.request_id,
            message.opcode,
            message.status,
            message.message,
            version=self.version,
        )
        self.writer.queue(frame, 1)

    def _run_request(self, message: AddRun) -> Request | None:
        """The node's request for an ADD_RUN frame, or None when the run is refused
        whole (an entry too large, a bad id: answered here, nothing journalled)."""
        try:
            run = self.node.run_request(
                message.ledger_id,
                message.first_entry_id,
                message.payloads,
                master_key=message.master_key,
                recovery=message.recovery,
                last_add_confirmed=message.last_add_confirmed,
                on_done=self.on_run_done,
            )
        except PoraError as error:
            self.writer.queue(
                error_frame(message.request_id, Opcode.ADD_RUN, error, self.version), 1
            )
            return None
        run.tag = message.request_id
        return run

    def _overloaded(self, request_id: int, opcode: int) -> None:
        self.writer.queue(
            encode_error(
                request_id,
                opcode,
                Status.OVERLOADED,
                f"the node has {self.config.inflight_node_max} requests in flight "
                "(inflight_node_max); retry later",
                version=self.version,
            ),
            1,
        )

    def _range_bytes_max(self, message: ReadRange) -> int:
        # keep the response within a frame the client accepts
        return max(1, min(message.max_bytes, self.config.frame_bytes_max // 2))

    async def _perform(self, message: RequestMessage, opcode: int) -> None:
        held = _Held()  # read-response bytes reserved for this request
        try:
            try:
                frame = await self._execute(message, held)
            except PoraError as error:
                if isinstance(error, StorageCorruption):
                    _log_corruption(message, error)
                frame = error_frame(message.request_id, opcode, error, self.version)
            except Exception as error:  # a bug: answer it, log it, keep serving
                _log.exception("request %r failed", message)
                frame = encode_error(
                    message.request_id,
                    opcode,
                    Status.INTERNAL_ERROR,
                    f"internal error: {error!r}",
                    version=self.version,
                )
            read_bytes = 0
            if held.bytes:  # a read: its response holds its own size until sent
                read_bytes = len(frame)
                self.read_bytes.resize(held.bytes, read_bytes)
                held.bytes = 0
        finally:
            self.counters.inflight -= 1
            if held.bytes:  # cancelled: the connection is ending
                self.read_bytes.release(held.bytes)
        self.writer.queue(frame, 1, read_bytes)

    # --- read-response bytes -----------------------------------------------------------------

    async def _reserve_read(self, held: _Held, size: int) -> None:
        """Reserve `size` bytes for a read's response (see `ReadBytes.reserve`)."""
        await self.read_bytes.reserve(size)
        held.bytes += size

    def _entry_response_bytes_max(self) -> int:
        return self.node.config.entry_bytes_max + ENTRY_RESPONSE_OVERHEAD

    def _range_response_bytes_max(self, message: ReadRange) -> int:
        # at most max_bytes of payload, or one entry when the first one is larger
        payload = max(self._range_bytes_max(message), self.node.config.entry_bytes_max)
        entries = max(1, min(message.max_entries, RANGE_ENTRIES_MAX))
        fixed = frames.HEADER_BYTES + frames.READ_RANGE_RESPONSE.size
        return fixed + payload + entries * frames.RANGE_ITEM.size

    async def _read_entry(self, message: ReadEntry, held: _Held) -> bytes:
        """The payload of a READ_ENTRY, read under a reservation of read-response
        bytes; a long poll waits for its entry holding none."""
        node = self.node
        await self._reserve_read(held, self._entry_response_bytes_max())
        if message.wait_ms <= 0:
            return await node.read_entry(message.ledger_id, message.entry_id)
        try:
            return await node.read_entry(message.ledger_id, message.entry_id)
        except (NoSuchEntry, NoSuchLedger):
            pass
        self.read_bytes.release(held.bytes)
        held.bytes = 0
        payload = await self._long_poll(
            message.wait_ms,
            lambda wait_s: node.read_entry(message.ledger_id, message.entry_id, wait_s=wait_s),
        )
        # (an entry that just arrived is the memtable's own bytes: no copy waits here)
        await self._reserve_read(held, len(payload) + ENTRY_RESPONSE_OVERHEAD)
        return payload

    async def _long_poll(self, wait_ms: int, wait: Callable[[float], Awaitable[_T]]) -> _T:
        """A read that may wait (`wait`, given the seconds to wait at most: for its
        entry, or for the LAC to pass what the reader knows); shutdown ends the wait
        at once (the client may retry on another node), answering SHUTTING_DOWN."""
        wait_s = min(wait_ms, LONG_POLL_MS_MAX) / 1000.0
        long_polls = self.long_polls
        if not long_polls.stopping:
            with trio.CancelScope() as scope:
                long_polls.scopes.add(scope)
                try:
                    return await wait(wait_s)
                finally:
                    long_polls.scopes.discard(scope)
        raise NodeClosed("the node is shutting down; read from another node, or retry")

    async def _read_lac(self, message: ReadLac, held: _Held) -> bytes:
        if message.fence:
            await self.node.fence_ledger(message.ledger_id, master_key=message.master_key)
        if self.version < _V4:
            lac = self.node.last_add_confirmed(message.ledger_id)
            return self._encode(LacResponse(message.request_id, message.ledger_id, lac))
        if message.wait_ms > 0:
            lac, last = await self._long_poll(
                message.wait_ms,
                lambda wait_s: self.node.read_lac(
                    message.ledger_id, known_lac=message.known_lac, wait_s=wait_s
                ),
            )
        else:
            lac, last = await self.node.read_lac(message.ledger_id)
        entry = None
        if message.with_entry and last > message.known_lac:
            entry = await self._next_entry(message, held)
        return self._encode(LacResponse(message.request_id, message.ledger_id, lac, last, entry))

    async def _next_entry(self, message: ReadLac, held: _Held) -> bytes | None:
        """The entry after `known_lac`, for a READ_LAC asked with it, read under a
        reservation of read-response bytes; None when the node does not hold it (a
        node of an ensemble holds only its write sets' entries). A damaged copy fails
        the whole answer (CORRUPT): absence is never claimed for it."""
        await self._reserve_read(held, self._entry_response_bytes_max())
        try:
            return await self.node.read_entry(message.ledger_id, message.known_lac + 1)
        except NoSuchEntry:
            return None

    async def _read_range(self, message: ReadRange, held: _Held) -> bytes:
        node = self.node
        if message.fence:
            await node.fence_ledger(message.ledger_id, master_key=message.master_key)
        await self._reserve_read(held, self._range_response_bytes_max(message))
        entries, more = await node.read_range_page(
            message.ledger_id,
            message.first_entry_id,
            message.last_entry_id,
            max_entries=max(1, min(message.max_entries, RANGE_ENTRIES_MAX)),
            max_bytes=self._range_bytes_max(message),
        )
        lac = node.last_add_confirmed(message.ledger_id)
        return self._encode(
            ReadRangeResponse(message.request_id, message.ledger_id, lac, entries, more)
        )

    async def _add_batch(self, message: AddBatch) -> bytes:
        """An ADD_BATCH, through the node's batch path (one submission, a run per
        stretch of consecutive ids). Every entry refused by the ledger (no conflict
        among them): an error status, nothing stored; else OK listing the failures."""
        outcomes = await self.node.add_batch(
            message.ledger_id,
            message.entry_ids,
            message.payloads,
            master_key=message.master_key,
            recovery=message.recovery,
            last_add_confirmed=message.last_add_confirmed,
        )
        errors = [error for error in outcomes if error is not None]
        if len(errors) == len(outcomes) and not any(isinstance(e, EntryConflict) for e in errors):
            raise errors[0]
        failures = [
            (entry_id, int(status_of(error)), str(error))
            for entry_id, error in zip(message.entry_ids, outcomes, strict=True)
            if error is not None
        ]
        return self._encode(
            AddBatchResponse(
                message.request_id,
                message.ledger_id,
                message.entry_ids[0],
                len(outcomes),
                failures,
            )
        )

    async def _execute(self, message: RequestMessage, held: _Held) -> bytes:  # noqa: PLR0911 (one per op)
        node = self.node
        rid = message.request_id
        if isinstance(message, AddBatch):
            return await self._add_batch(message)
        if isinstance(message, WriteLac):
            lac = await node.write_lac(
                message.ledger_id, message.last_add_confirmed, master_key=message.master_key
            )
            return self._encode(WriteLacResponse(rid, message.ledger_id, lac))
        if isinstance(message, ReadEntry):
            if message.fence:
                await node.fence_ledger(message.ledger_id, master_key=message.master_key)
            payload = await self._read_entry(message, held)
            lac = node.last_add_confirmed(message.ledger_id)
            return self._encode(
                ReadEntryResponse(rid, message.ledger_id, message.entry_id, lac, payload)
            )
        if isinstance(message, ReadRange):
            return await self._read_range(message, held)
        if isinstance(message, ReadLac):
            return await self._read_lac(message, held)
        if isinstance(message, Fence):
            last = await node.fence_ledger(message.ledger_id, master_key=message.master_key)
            return self._encode(FenceResponse(rid, message.ledger_id, last))
        if isinstance(message, Close):
            last = await node.close_ledger(
                message.ledger_id, message.last_entry_id, master_key=message.master_key
            )
            return self._encode(CloseResponse(rid, message.ledger_id, last))
        if isinstance(message, Delete):
            await node.delete_ledger(message.ledger_id, master_key=message.master_key)
            return self._encode(DeleteResponse(rid, message.ledger_id))
        if isinstance(message, ListLedgers):
            count_max = max(1, min(message.max_count, LIST_LEDGERS_MAX))
            # a page of 10,000 ledgers is 450 KiB: held like a read's response
            fixed = frames.HEADER_BYTES + frames.LIST_RESPONSE.size
            await self._reserve_read(held, fixed + count_max * frames.LEDGER_SUMMARY.size)
            # one more than the page: whether MORE follow
            infos = node.ledgers(after_ledger_id=message.after_ledger_id, count_max=count_max + 1)
            page = [
                LedgerSummary(
                    i.ledger_id,
                    i.state,
                    i.first_entry_id,
                    i.last_entry_id,
                    i.entry_count,
                    i.payload_bytes,
                    i.created_ms,
                )
                for i in infos[:count_max]
            ]
            return self._encode(ListLedgersResponse(rid, page, len(infos) > count_max))
        assert isinstance(message, Info)
        return self._encode(
            InfoResponse(
                rid,
                frames.PROTOCOL_VERSION,
                node.read_only,
                self.config.frame_bytes_max,
                node.config.entry_bytes_max,
                node.statistics().ledgers.ledgers,
                pora.__version__,
                node.data_dir.instance_id,
            )
        )
