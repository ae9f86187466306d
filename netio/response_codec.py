"""Responses: their encoders (the server's side), with one encoder per message
type, and the bounded `ResponseDecoder` (the client's), with one decoder per opcode.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from netio import frames
from netio.errors import ProtocolError
from netio.framing import (
    _BAD_REQUEST,
    _CORRUPT_SINCE,
    _HEADER_BYTES,
    _LENGTH_MIN,
    _OP_ADD,
    _OP_RUN,
    _RESPONSE,
    _U32,
    _V4,
    _VERSION_NEWEST,
    RECEIVE_BYTES_DEFAULT,
    _bad_add_response,
    _FrameBuffer,
    _header,
    _short_frame,
)
from netio.messages import (
    AddBatchResponse,
    AddEntryResponse,
    AddRunResponse,
    CloseResponse,
    DeleteResponse,
    ErrorResponse,
    FenceResponse,
    InfoResponse,
    LacResponse,
    LedgerSummary,
    ListLedgersResponse,
    ReadEntryResponse,
    ReadRangeResponse,
    ResponseMessage,
    WriteLacResponse,
)

# --- encoding responses ------------------------------------------------------------------------


def encode_add_run_responses(
    runs: Sequence[tuple[Sequence[int], int, int]], version: int = _VERSION_NEWEST
) -> bytearray:
    """OK responses to runs of adds, packed into one buffer (one `send_all` for all).

    Each run is `(request_ids, ledger_id, first_entry_id)`: its adds were entries
    first_entry_id, first_entry_id + 1, ... of the ledger, asked by those requests.
    """
    size = frames.ADD_RESPONSE_BYTES
    out = bytearray(sum([len(request_ids) for request_ids, _, _ in runs]) * size)
    pack = frames.ADD_RESPONSE.pack_into
    length = size - 4
    op = int(frames.Opcode.ADD_ENTRY)
    offset = 0
    for request_ids, ledger_id, first_entry_id in runs:
        for index, request_id in enumerate(request_ids):
            pack(
                out,
                offset,
                length,
                version,
                op,
                _RESPONSE,
                0,
                request_id,
                ledger_id,
                first_entry_id + index,
            )
            offset += size
    return out


def encode_error(
    request_id: int,
    opcode: int,
    status: int,
    message: str,
    *,
    ledger_id: int = -1,
    entry_id: int = -1,
    version: int = _VERSION_NEWEST,
) -> bytes:
    """An error response; the message is cut to ERROR_MESSAGE_BYTES_MAX bytes of UTF-8.
    A status the peer's `version` does not know is sent as INTERNAL_ERROR (the
    message still says what happened)."""
    if status == frames.Status.CORRUPT and version < _CORRUPT_SINCE:
        status = frames.Status.INTERNAL_ERROR
    text = message.encode("utf-8", "replace")[: frames.ERROR_MESSAGE_BYTES_MAX]
    body = frames.ERROR_RESPONSE.pack(ledger_id, entry_id) + text
    return _header(opcode, _RESPONSE, status, request_id, len(body), version) + body


def _ok(
    opcode: int, request_id: int, body: bytes, flags: int = 0, version: int = _VERSION_NEWEST
) -> bytes:
    return _header(opcode, _RESPONSE | flags, 0, request_id, len(body), version) + body


def encode_add_run_response(
    request_id: int,
    ledger_id: int,
    first_entry_id: int,
    count: int,
    failures: Sequence[tuple[int, int, str]] = (),
    version: int = _VERSION_NEWEST,
    opcode: int = _OP_RUN,
) -> bytes:
    """The OK response to an ADD_RUN (or, with its `opcode`, an ADD_BATCH): all
    `count` entries stored but `failures`, each `(entry_id, status, message)`;
    messages are cut to ERROR_MESSAGE_BYTES_MAX bytes."""
    head = frames.ADD_RUN_RESPONSE.pack(ledger_id, first_entry_id, count, len(failures))
    if not failures:
        return _ok(opcode, request_id, head, version=version)
    parts = [head]
    for entry_id, status, message in failures:
        text = message.encode("utf-8", "replace")[: frames.ERROR_MESSAGE_BYTES_MAX]
        parts.append(frames.RUN_FAILURE.pack(entry_id, status, len(text)))
        parts.append(text)
    return _ok(opcode, request_id, b"".join(parts), version=version)


def _encode_add_entry_response(m: AddEntryResponse, version: int) -> bytes:
    return frames.ADD_RESPONSE.pack(
        frames.ADD_RESPONSE_BYTES - 4,
        version,
        _OP_ADD,
        _RESPONSE,
        0,
        m.request_id,
        m.ledger_id,
        m.entry_id,
    )


def _encode_add_run_response(m: AddRunResponse, version: int) -> bytes:
    return encode_add_run_response(
        m.request_id, m.ledger_id, m.first_entry_id, m.count, m.failures, version
    )


def _encode_add_batch_response(m: AddBatchResponse, version: int) -> bytes:
    return encode_add_run_response(
        m.request_id,
        m.ledger_id,
        m.first_entry_id,
        m.count,
        m.failures,
        version,
        frames.Opcode.ADD_BATCH,
    )


def _encode_write_lac_response(m: WriteLacResponse, version: int) -> bytes:
    body = frames.LEDGER_AND_VALUE.pack(m.ledger_id, m.last_add_confirmed)
    return _ok(frames.Opcode.WRITE_LAC, m.request_id, body, version=version)


def _encode_error_response(m: ErrorResponse, version: int) -> bytes:
    return encode_error(
        m.request_id,
        m.opcode,
        m.status,
        m.message,
        ledger_id=m.ledger_id,
        entry_id=m.entry_id,
        version=version,
    )


def _encode_read_entry_response(m: ReadEntryResponse, version: int) -> bytes:
    fixed = frames.READ_ENTRY_RESPONSE.pack(m.ledger_id, m.entry_id, m.last_add_confirmed)
    return _ok(frames.Opcode.READ_ENTRY, m.request_id, fixed + m.payload, version=version)


def _encode_read_range_response(m: ReadRangeResponse, version: int) -> bytes:
    parts = [frames.READ_RANGE_RESPONSE.pack(m.ledger_id, m.last_add_confirmed, len(m.entries))]
    for entry_id, payload in m.entries:
        parts.append(frames.RANGE_ITEM.pack(entry_id, len(payload)))
        parts.append(payload)
    more = int(frames.Flag.MORE) if m.more and version >= _V4 else 0
    return _ok(frames.Opcode.READ_RANGE, m.request_id, b"".join(parts), more, version)


def _encode_lac_response(m: LacResponse, version: int) -> bytes:
    if version < _V4:
        body = frames.LEDGER_AND_VALUE.pack(m.ledger_id, m.last_add_confirmed)
        return _ok(frames.Opcode.READ_LAC, m.request_id, body, version=version)
    body = frames.READ_LAC_RESPONSE_V4.pack(m.ledger_id, m.last_add_confirmed, m.last_entry_id)
    if m.entry is None:
        return _ok(frames.Opcode.READ_LAC, m.request_id, body, version=version)
    return _ok(frames.Opcode.READ_LAC, m.request_id, body + m.entry, frames.Flag.ENTRY, version)


def _encode_fence_response(m: FenceResponse, version: int) -> bytes:
    body = frames.LEDGER_AND_VALUE.pack(m.ledger_id, m.last_entry_id)
    return _ok(frames.Opcode.FENCE, m.request_id, body, version=version)


def _encode_close_response(m: CloseResponse, version: int) -> bytes:
    body = frames.LEDGER_AND_VALUE.pack(m.ledger_id, m.last_entry_id)
    return _ok(frames.Opcode.CLOSE, m.request_id, body, version=version)


def _encode_delete_response(m: DeleteResponse, version: int) -> bytes:
    body = frames.LEDGER_ONLY.pack(m.ledger_id)
    return _ok(frames.Opcode.DELETE, m.request_id, body, version=version)


def _encode_list_ledgers_response(m: ListLedgersResponse, version: int) -> bytes:
    parts = [frames.LIST_RESPONSE.pack(len(m.ledgers))]
    for summary in m.ledgers:
        parts.append(
            frames.LEDGER_SUMMARY.pack(
                summary.ledger_id,
                frames.LEDGER_STATES[summary.state],
                summary.first_entry_id,
                summary.last_entry_id,
                summary.entry_count,
                summary.payload_bytes,
                summary.created_ms,
            )
        )
    more = int(frames.Flag.MORE) if m.more else 0
    return _ok(frames.Opcode.LIST_LEDGERS, m.request_id, b"".join(parts), more, version)


def _encode_info_response(m: InfoResponse, version: int) -> bytes:
    server_version = m.server_version.encode("utf-8")[:255]
    reason = (m.read_only_reason or "").encode("utf-8")[: frames.ERROR_MESSAGE_BYTES_MAX]
    fixed = frames.INFO_RESPONSE.pack(
        m.protocol_version,
        1 if m.read_only_reason is not None else 0,
        m.frame_bytes_max,
        m.entry_bytes_max,
        m.ledger_count,
        len(server_version),
    )
    if version >= _V4:
        instance = m.instance_id.encode("utf-8")[:255]
        fixed += server_version + bytes([len(instance)]) + instance
    else:
        fixed += server_version
    return _ok(frames.Opcode.INFO, m.request_id, fixed + reason, version=version)


#: Each response message type's encoder, `(message, version) -> frame`: one entry per
#: type, so a new response is one function and one line here.
_RESPONSE_ENCODERS: Final[dict[type[ResponseMessage], Callable[..., bytes]]] = {
    AddEntryResponse: _encode_add_entry_response,
    AddRunResponse: _encode_add_run_response,
    AddBatchResponse: _encode_add_batch_response,
    WriteLacResponse: _encode_write_lac_response,
    ErrorResponse: _encode_error_response,
    ReadEntryResponse: _encode_read_entry_response,
    ReadRangeResponse: _encode_read_range_response,
    LacResponse: _encode_lac_response,
    FenceResponse: _encode_fence_response,
    CloseResponse: _encode_close_response,
    DeleteResponse: _encode_delete_response,
    ListLedgersResponse: _encode_list_ledgers_response,
    InfoResponse: _encode_info_response,
}


def encode_response(message: ResponseMessage, version: int = _VERSION_NEWEST) -> bytes:
    """The frame of any response message, in protocol `version` (the request's)."""
    return _RESPONSE_ENCODERS[type(message)](message, version)


class ResponseDecoder(_FrameBuffer):
    """The client side: bytes in, response messages out, of one protocol `version`
    (the one its requests were sent in)."""

    __slots__ = ("version",)

    def __init__(
        self,
        frame_bytes_max: int = frames.FRAME_BYTES_MAX_DEFAULT,
        receive_bytes_max: int = RECEIVE_BYTES_DEFAULT,
        version: int = _VERSION_NEWEST,
    ) -> None:
        super().__init__(frame_bytes_max, receive_bytes_max)
        self.version = version

    def next_responses(self) -> list[ResponseMessage]:
        """Every complete response buffered, in order. Raises ProtocolError for bytes
        that are not a valid response (the connection must then be dropped)."""
        if self._poisoned is not None:
            raise self._poisoned
        buf = self._buffer
        pos = self._position
        end = len(buf)
        out: list[ResponseMessage] = []
        frame_max = self._frame_bytes_max
        add_unpack = frames.ADD_RESPONSE.unpack_from
        add_length = frames.ADD_RESPONSE_BYTES - 4
        add_op = int(frames.Opcode.ADD_ENTRY)
        expected = self.version
        try:
            while end - pos >= 4:
                (length,) = _U32.unpack_from(buf, pos)
                if length > frame_max:
                    raise self._too_large(length, pos)
                if length < _LENGTH_MIN:
                    raise _short_frame(length)
                frame_end = pos + 4 + length
                if frame_end > end:
                    break
                if length == add_length and buf[pos + 5] == add_op and buf[pos + 7] == 0:
                    _, version, _, flags, _, rid, lid, eid = add_unpack(buf, pos)
                    if version != expected or flags != _RESPONSE:
                        raise _bad_add_response(rid, version, flags)
                    out.append(AddEntryResponse(rid, lid, eid))
                else:
                    out.append(_decode_response(buf, pos, frame_end, expected))
                pos = frame_end
        except ProtocolError as error:
            return self._fail(error, out)
        except (struct.error, ValueError, KeyError) as error:
            return self._fail(
                ProtocolError(f"malformed response: {error}", status=_BAD_REQUEST), out
            )
        self._position = pos
        if pos == end:
            self._buffer = b""
            self._position = 0
        return out


def _overruns(rid: int, what: str) -> ProtocolError:
    return ProtocolError(
        f"{what} response {rid} overruns its frame", status=_BAD_REQUEST, request_id=rid
    )


def _decode_add_entry_response(
    buf: bytes, rid: int, flags: int, body: int, end: int
) -> AddEntryResponse:
    ledger_id, entry_id = frames.LEDGER_AND_VALUE.unpack_from(buf, body)
    return AddEntryResponse(rid, ledger_id, entry_id)


def _decode_read_entry_response(
    buf: bytes, rid: int, flags: int, body: int, end: int
) -> ReadEntryResponse:
    ledger_id, entry_id, lac = frames.READ_ENTRY_RESPONSE.unpack_from(buf, body)
    return ReadEntryResponse(
        rid, ledger_id, entry_id, lac, buf[body + frames.READ_ENTRY_RESPONSE.size : end]
    )


def _decode_read_range_response(
    buf: bytes, rid: int, flags: int, body: int, end: int
) -> ReadRangeResponse:
    ledger_id, lac, count = frames.READ_RANGE_RESPONSE.unpack_from(buf, body)
    at = body + frames.READ_RANGE_RESPONSE.size
    item = frames.RANGE_ITEM
    entries: list[tuple[int, bytes]] = []
    for _ in range(count):
        if at + item.size > end:
            raise _overruns(rid, "range")
        entry_id, size = item.unpack_from(buf, at)
        at += item.size
        if at + size > end:
            raise _overruns(rid, "range")
        entries.append((entry_id, buf[at : at + size]))
        at += size
    if at != end:
        raise _overruns(rid, "range")  # (bytes after its last entry)
    return ReadRangeResponse(rid, ledger_id, lac, entries, bool(flags & frames.Flag.MORE))


def _decode_lac_response(buf: bytes, rid: int, flags: int, body: int, end: int) -> LacResponse:
    return LacResponse(rid, *frames.LEDGER_AND_VALUE.unpack_from(buf, body))


def _decode_lac_response_v4(buf: bytes, rid: int, flags: int, body: int, end: int) -> LacResponse:
    lid, lac, last = frames.READ_LAC_RESPONSE_V4.unpack_from(buf, body)
    after = body + frames.READ_LAC_RESPONSE_V4.size
    if flags & frames.Flag.ENTRY:
        return LacResponse(rid, lid, lac, last, bytes(buf[after:end]))
    if after != end:
        raise ProtocolError(
            f"bad response {rid}: READ_LAC body has {end - after} bytes past its "
            "fields without the ENTRY flag",
            status=_BAD_REQUEST,
            request_id=rid,
        )
    return LacResponse(rid, lid, lac, last)


def _decode_write_lac_response(
    buf: bytes, rid: int, flags: int, body: int, end: int
) -> WriteLacResponse:
    return WriteLacResponse(rid, *frames.LEDGER_AND_VALUE.unpack_from(buf, body))


def _decode_add_batch_response(
    buf: bytes, rid: int, flags: int, body: int, end: int
) -> AddBatchResponse:
    run = _decode_add_run_response(buf, rid, body, end)
    return AddBatchResponse(rid, run.ledger_id, run.first_entry_id, run.count, run.failures)


def _decode_info_response_v4(buf: bytes, rid: int, flags: int, body: int, end: int) -> InfoResponse:
    protocol, read_only, frame_max, entry_max, ledger_count, version_bytes = (
        frames.INFO_RESPONSE.unpack_from(buf, body)
    )
    at = body + frames.INFO_RESPONSE.size
    version_end = at + version_bytes
    if version_end + 1 > end:
        raise _overruns(rid, "info")
    instance_end = version_end + 1 + buf[version_end]
    if instance_end > end or (not read_only and instance_end != end):
        raise _overruns(rid, "info")
    return InfoResponse(
        rid,
        protocol,
        buf[instance_end:end].decode("utf-8", "replace") if read_only else None,
        frame_max,
        entry_max,
        ledger_count,
        buf[at:version_end].decode("utf-8", "replace"),
        buf[version_end + 1 : instance_end].decode("utf-8", "replace"),
    )


def _decode_fence_response(buf: bytes, rid: int, flags: int, body: int, end: int) -> FenceResponse:
    return FenceResponse(rid, *frames.LEDGER_AND_VALUE.unpack_from(buf, body))


def _decode_close_response(buf: bytes, rid: int, flags: int, body: int, end: int) -> CloseResponse:
    return CloseResponse(rid, *frames.LEDGER_AND_VALUE.unpack_from(buf, body))


def _decode_delete_response(
    buf: bytes, rid: int, flags: int, body: int, end: int
) -> DeleteResponse:
    (ledger_id,) = frames.LEDGER_ONLY.unpack_from(buf, body)
    return DeleteResponse(rid, ledger_id)


def _decode_list_ledgers_response(
    buf: bytes, rid: int, flags: int, body: int, end: int
) -> ListLedgersResponse:
    (count,) = frames.LIST_RESPONSE.unpack_from(buf, body)
    at = body + frames.LIST_RESPONSE.size
    summary = frames.LEDGER_SUMMARY
    if at + count * summary.size != end:
        raise _overruns(rid, "list")
    ledgers = []
    for _ in range(count):
        ledger_id, state, first, last, entry_count, payload_bytes, created_ms = summary.unpack_from(
            buf, at
        )
        at += summary.size
        ledgers.append(
            LedgerSummary(
                ledger_id,
                frames.LEDGER_STATE_NAMES[state],
                first,
                last,
                entry_count,
                payload_bytes,
                created_ms,
            )
        )
    return ListLedgersResponse(rid, ledgers, bool(flags & frames.Flag.MORE))


def _decode_info_response(buf: bytes, rid: int, flags: int, body: int, end: int) -> InfoResponse:
    protocol, read_only, frame_max, entry_max, ledger_count, version_bytes = (
        frames.INFO_RESPONSE.unpack_from(buf, body)
    )
    at = body + frames.INFO_RESPONSE.size
    version_end = at + version_bytes
    if version_end > end or (not read_only and version_end != end):
        raise _overruns(rid, "info")
    server_version = buf[at:version_end].decode("utf-8", "replace")
    reason = buf[version_end:end].decode("utf-8", "replace") if read_only else None
    return InfoResponse(rid, protocol, reason, frame_max, entry_max, ledger_count, server_version)


def _decode_add_run_response_body(
    buf: bytes, rid: int, flags: int, body: int, end: int
) -> AddRunResponse:
    return _decode_add_run_response(buf, rid, body, end)


class _OkResponse(NamedTuple):
    """How one opcode's OK response is read: the bytes of its body's fixed part and
    whether that is all of it (checked before the body is read, so that a frame too
    short is never read on into the next frame, and one too long never passes with
    bytes nobody looked at), and its decoder, `(buffer, request id, flags, body
    start, frame end) -> message`."""

    fixed_bytes: int
    fixed_is_whole: bool
    decode: Callable[[bytes, int, int, int, int], ResponseMessage]


#: One entry per opcode. (ADD_RUN's decoder checks its own body.)
_OK_RESPONSES: Final[dict[int, _OkResponse]] = {
    frames.Opcode.ADD_ENTRY: _OkResponse(
        frames.LEDGER_AND_VALUE.size, True, _decode_add_entry_response
    ),
    frames.Opcode.ADD_RUN: _OkResponse(0, False, _decode_add_run_response_body),
    frames.Opcode.READ_ENTRY: _OkResponse(
        frames.READ_ENTRY_RESPONSE.size, False, _decode_read_entry_response
    ),
    frames.Opcode.READ_RANGE: _OkResponse(
        frames.READ_RANGE_RESPONSE.size, False, _decode_read_range_response
    ),
    frames.Opcode.READ_LAC: _OkResponse(frames.LEDGER_AND_VALUE.size, True, _decode_lac_response),
    frames.Opcode.FENCE: _OkResponse(frames.LEDGER_AND_VALUE.size, True, _decode_fence_response),
    frames.Opcode.CLOSE: _OkResponse(frames.LEDGER_AND_VALUE.size, True, _decode_close_response),
    frames.Opcode.DELETE: _OkResponse(frames.LEDGER_ONLY.size, True, _decode_delete_response),
    frames.Opcode.LIST_LEDGERS: _OkResponse(
        frames.LIST_RESPONSE.size, False, _decode_list_ledgers_response
    ),
    frames.Opcode.INFO: _OkResponse(frames.INFO_RESPONSE.size, False, _decode_info_response),
}
#: Where version 4 differs: new opcodes and longer bodies.
_OK_RESPONSES_V4: Final[dict[int, _OkResponse]] = {
    **_OK_RESPONSES,
    frames.Opcode.READ_LAC: _OkResponse(
        frames.READ_LAC_RESPONSE_V4.size, False, _decode_lac_response_v4
    ),
    frames.Opcode.INFO: _OkResponse(frames.INFO_RESPONSE.size, False, _decode_info_response_v4),
    frames.Opcode.ADD_BATCH: _OkResponse(0, False, _decode_add_batch_response),
    frames.Opcode.WRITE_LAC: _OkResponse(
        frames.LEDGER_AND_VALUE.size, True, _decode_write_lac_response
    ),
}


def _decode_error_response(
    buf: bytes, rid: int, opcode: int, status: int, body: int, end: int
) -> ErrorResponse:
    if body + frames.ERROR_RESPONSE.size > end:  # else the ids come from the next frame
        raise ProtocolError(
            f"bad response {rid}: error body of {end - body} bytes, under the "
            f"{frames.ERROR_RESPONSE.size} of its ledger and entry ids",
            status=_BAD_REQUEST,
            request_id=rid,
        )
    ledger_id, entry_id = frames.ERROR_RESPONSE.unpack_from(buf, body)
    message = buf[body + frames.ERROR_RESPONSE.size : end].decode("utf-8", "replace")
    return ErrorResponse(rid, opcode, status, ledger_id, entry_id, message)


def _decode_response(
    buf: bytes, pos: int, frame_end: int, expected_version: int
) -> ResponseMessage:
    _, version, opcode, flags, status, rid = frames.HEADER.unpack_from(buf, pos)
    if version != expected_version or not flags & _RESPONSE:
        raise ProtocolError(
            f"bad response {rid}: version {version}, flags 0x{flags:02x}",
            status=_BAD_REQUEST,
            request_id=rid,
        )
    body = pos + _HEADER_BYTES
    if status != frames.Status.OK:
        return _decode_error_response(buf, rid, opcode, status, body, frame_end)
    kind = (_OK_RESPONSES_V4 if version >= _V4 else _OK_RESPONSES).get(opcode)
    if kind is None:
        raise ProtocolError(f"response {rid} has unknown opcode {opcode}", status=_BAD_REQUEST)
    have = frame_end - body
    if have < kind.fixed_bytes or (kind.fixed_is_whole and have != kind.fixed_bytes):
        wanted = f"{kind.fixed_bytes}" if kind.fixed_is_whole else f"at least {kind.fixed_bytes}"
        raise ProtocolError(
            f"bad response {rid}: {frames.Opcode(opcode).name} body of {have} bytes, "
            f"expected {wanted}",
            status=_BAD_REQUEST,
            request_id=rid,
        )
    return kind.decode(buf, rid, flags, body, frame_end)


def _decode_add_run_response(buf: bytes, rid: int, body: int, frame_end: int) -> AddRunResponse:
    def overrun(what: str) -> ProtocolError:
        return ProtocolError(f"ADD_RUN response {rid}: {what}", status=_BAD_REQUEST, request_id=rid)

    at = body + frames.ADD_RUN_RESPONSE.size
    if at > frame_end:
        raise overrun(f"body of {frame_end - body} bytes, under the {at - body} it needs")
    lid, first, count, failure_count = frames.ADD_RUN_RESPONSE.unpack_from(buf, body)
    failures: list[tuple[int, int, str]] = []
    for _ in range(failure_count):
        if at + frames.RUN_FAILURE.size > frame_end:
            raise overrun(f"failure {len(failures)} of {failure_count} runs past the frame")
        entry_id, status, size = frames.RUN_FAILURE.unpack_from(buf, at)
        at += frames.RUN_FAILURE.size
        if at + size > frame_end or status == frames.Status.OK:
            raise overrun(f"failure of entry {entry_id} is malformed")
        failures.append((entry_id, status, buf[at : at + size].decode("utf-8", "replace")))
        at += size
    if at != frame_end:
        raise overrun(f"{frame_end - at} bytes after its last failure")
    return AddRunResponse(rid, lid, first, count, failures)
