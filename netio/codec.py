"""Encoders and bounded decoders of frames: bytes in, messages out; messages in, bytes out.

Pure code, no I/O (in the manner of h11): a server feeds what its socket gave to a
`RequestDecoder` and takes back every complete request; a client does the same with
a `ResponseDecoder`. The decoders hold at most one incomplete frame plus one received
chunk, and refuse a frame whose length prefix exceeds the configured maximum before
any of its body is buffered.

Speed: one `unpack_from` per add frame (header and fixed body together), payloads
sliced once from the receive buffer, one message object per frame; the encoders of
add responses pack straight into one buffer for many frames. The bulk encoders
and decoders of a load generator are in `netio.bulk`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import accumulate, pairwise
from typing import Final, NamedTuple, TypeVar

from netio import frames
from netio.errors import ProtocolError
from netio.messages import (
    AddEntry,
    AddEntryResponse,
    AddRun,
    AddRunResponse,
    Close,
    CloseResponse,
    Delete,
    DeleteResponse,
    ErrorResponse,
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
)
from netio.security import MASTER_KEY_BYTES_MAX

_Decoded = TypeVar("_Decoded")
_U32: Final = struct.Struct(">I")
_EMPTY: Final = struct.Struct("")
_VERSION_NEWEST: Final = frames.PROTOCOL_VERSION
_RESPONSE: Final = int(frames.Flag.RESPONSE)
_HEADER_BYTES: Final = frames.HEADER_BYTES
_LENGTH_MIN: Final = frames.LENGTH_MIN
_BAD_REQUEST: Final = int(frames.Status.BAD_REQUEST)

_ADD_PACK: Final = frames.ADD_REQUEST.pack
_ADD_LENGTH_BASE: Final = _LENGTH_MIN + frames.ADD_REQUEST_FIXED.size
_OP_ADD: Final = int(frames.Opcode.ADD_ENTRY)
_FLAG_RECOVERY: Final = int(frames.Flag.RECOVERY)

_RUN_PACK: Final = frames.ADD_RUN_REQUEST.pack
_RUN_UNPACK: Final = frames.ADD_RUN_REQUEST.unpack_from
_RUN_FIXED: Final = frames.ADD_RUN_REQUEST.size
_RUN_LENGTH_BASE: Final = _LENGTH_MIN + frames.ADD_RUN_REQUEST_FIXED.size
_OP_RUN: Final = int(frames.Opcode.ADD_RUN)
_RUN_MAX: Final = frames.RUN_ENTRIES_MAX
#: `struct` formats of 1 .. RUN_ENTRIES_MAX big-endian u32 sizes, made on first use
_SIZES: dict[int, struct.Struct] = {}


def _sizes_struct(count: int) -> struct.Struct:
    layout = _SIZES.get(count)
    if layout is None:
        layout = _SIZES[count] = struct.Struct(f">{count}I")
    return layout


#: Bytes a receiver asks its socket for at a time (and so the most one feed adds).
RECEIVE_BYTES_DEFAULT: Final = 64 * 1024

_SERVED: Final = frames.PROTOCOL_VERSIONS_SERVED
_SERVED_TEXT: Final = " and ".join(str(version) for version in _SERVED)
#: the version that first carried the CORRUPT status; older peers get INTERNAL_ERROR
_CORRUPT_SINCE: Final = 3
#: the version whose DELETE carries the ledger's master key; older ones are refused
_DELETE_KEYED_SINCE: Final = 3


def _header(
    opcode: int,
    flags: int,
    status: int,
    request_id: int,
    body_bytes: int,
    version: int = _VERSION_NEWEST,
) -> bytes:
    return frames.HEADER.pack(_LENGTH_MIN + body_bytes, version, opcode, flags, status, request_id)


def _check_key(master_key: bytes) -> None:
    if len(master_key) > MASTER_KEY_BYTES_MAX:
        raise ValueError(
            f"master key of {len(master_key)} bytes; a ledger's master key has at most "
            f"{MASTER_KEY_BYTES_MAX} (derive one with master_key_from_password)"
        )


# --- encoding requests -------------------------------------------------------------------------


def encode_add_entry(
    request_id: int,
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    *,
    master_key: bytes = b"",
    last_add_confirmed: int = -1,
    recovery: bool = False,
) -> bytes:
    """One ADD_ENTRY frame."""
    key_bytes = len(master_key)
    if key_bytes > MASTER_KEY_BYTES_MAX:
        _check_key(master_key)
    head = _ADD_PACK(
        _ADD_LENGTH_BASE + key_bytes + len(payload),
        _VERSION_NEWEST,
        _OP_ADD,
        _FLAG_RECOVERY if recovery else 0,
        0,
        request_id,
        ledger_id,
        entry_id,
        last_add_confirmed,
        key_bytes,
    )
    if key_bytes:
        return b"".join((head, master_key, payload))
    return head + payload


def encode_add_run(
    request_id: int,
    ledger_id: int,
    first_entry_id: int,
    payloads: Sequence[bytes],
    *,
    master_key: bytes = b"",
    last_add_confirmed: int = -1,
    recovery: bool = False,
) -> bytes:
    """One ADD_RUN frame: entries first_entry_id, first_entry_id + 1, ... of one ledger
    with these payloads (1 to RUN_ENTRIES_MAX of them), answered by one response."""
    count = len(payloads)
    if not 1 <= count <= _RUN_MAX:
        raise ValueError(f"an ADD_RUN carries 1 to {_RUN_MAX} entries, got {count}")
    _check_key(master_key)
    sizes = [len(payload) for payload in payloads]
    key_bytes = len(master_key)
    head = _RUN_PACK(
        _RUN_LENGTH_BASE + key_bytes + 4 * count + sum(sizes),
        _VERSION_NEWEST,
        _OP_RUN,
        _FLAG_RECOVERY if recovery else 0,
        0,
        request_id,
        ledger_id,
        first_entry_id,
        last_add_confirmed,
        count,
        key_bytes,
    )
    return b"".join((head, master_key, _sizes_struct(count).pack(*sizes), *payloads))


def encode_request(message: RequestMessage) -> bytes:  # noqa: PLR0911 (one return per opcode)
    """The frame of any request message."""
    m = message
    if isinstance(m, AddEntry):
        return encode_add_entry(
            m.request_id,
            m.ledger_id,
            m.entry_id,
            m.payload,
            master_key=m.master_key,
            last_add_confirmed=m.last_add_confirmed,
            recovery=m.recovery,
        )
    if isinstance(m, AddRun):
        return encode_add_run(
            m.request_id,
            m.ledger_id,
            m.first_entry_id,
            m.payloads,
            master_key=m.master_key,
            last_add_confirmed=m.last_add_confirmed,
            recovery=m.recovery,
        )
    if isinstance(m, ReadEntry):
        _check_key(m.master_key)
        body = (
            frames.READ_ENTRY_REQUEST.pack(m.ledger_id, m.entry_id, m.wait_ms, len(m.master_key))
            + m.master_key
        )
        flags = frames.Flag.FENCE if m.fence else 0
        return _header(frames.Opcode.READ_ENTRY, flags, 0, m.request_id, len(body)) + body
    if isinstance(m, ReadRange):
        body = frames.READ_RANGE_REQUEST.pack(
            m.ledger_id, m.first_entry_id, m.last_entry_id, m.max_entries, m.max_bytes
        )
        return _header(frames.Opcode.READ_RANGE, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, ReadLac):
        body = frames.LEDGER_ONLY.pack(m.ledger_id)
        return _header(frames.Opcode.READ_LAC, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, Fence):
        _check_key(m.master_key)
        body = frames.FENCE_REQUEST.pack(m.ledger_id, len(m.master_key)) + m.master_key
        return _header(frames.Opcode.FENCE, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, Close):
        _check_key(m.master_key)
        last = frames.CLOSE_AT_LAST_STORED if m.last_entry_id is None else m.last_entry_id
        body = frames.CLOSE_REQUEST.pack(m.ledger_id, last, len(m.master_key)) + m.master_key
        return _header(frames.Opcode.CLOSE, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, Delete):
        _check_key(m.master_key)
        body = frames.DELETE_REQUEST.pack(m.ledger_id, len(m.master_key)) + m.master_key
        return _header(frames.Opcode.DELETE, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, ListLedgers):
        body = frames.LIST_REQUEST.pack(m.after_ledger_id, m.max_count)
        return _header(frames.Opcode.LIST_LEDGERS, 0, 0, m.request_id, len(body)) + body
    return _header(frames.Opcode.INFO, 0, 0, m.request_id, 0)


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
) -> bytes:
    """The OK response to an ADD_RUN: all `count` entries stored but `failures`, each
    `(entry_id, status, message)`; messages are cut to ERROR_MESSAGE_BYTES_MAX bytes."""
    head = frames.ADD_RUN_RESPONSE.pack(ledger_id, first_entry_id, count, len(failures))
    if not failures:
        return _ok(_OP_RUN, request_id, head, version=version)
    parts = [head]
    for entry_id, status, message in failures:
        text = message.encode("utf-8", "replace")[: frames.ERROR_MESSAGE_BYTES_MAX]
        parts.append(frames.RUN_FAILURE.pack(entry_id, status, len(text)))
        parts.append(text)
    return _ok(_OP_RUN, request_id, b"".join(parts), version=version)


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
    return _ok(frames.Opcode.READ_RANGE, m.request_id, b"".join(parts), version=version)


def _encode_lac_response(m: LacResponse, version: int) -> bytes:
    body = frames.LEDGER_AND_VALUE.pack(m.ledger_id, m.last_add_confirmed)
    return _ok(frames.Opcode.READ_LAC, m.request_id, body, version=version)


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
    return _ok(frames.Opcode.INFO, m.request_id, fixed + server_version + reason, version=version)


#: Each response message type's encoder, `(message, version) -> frame`: one entry per
#: type, so a new response is one function and one line here.
_RESPONSE_ENCODERS: Final[dict[type[ResponseMessage], Callable[..., bytes]]] = {
    AddEntryResponse: _encode_add_entry_response,
    AddRunResponse: _encode_add_run_response,
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


# --- decoding ----------------------------------------------------------------------------------


class _FrameBuffer:
    """The bounded receive buffer shared by both decoders.

    Holds the bytes not yet decoded: after `next_*` returns, at most one incomplete
    frame (bounded by the frame maximum, checked on its length prefix) plus whatever
    complete frames the caller chose not to take yet. Feeding more while complete
    frames wait is the caller's choice; the buffer refuses to grow past
    `frame_bytes_max + 4 + receive_bytes_max` so that a caller bug cannot become a
    memory leak either.
    """

    __slots__ = ("_buffer", "_buffer_bytes_max", "_frame_bytes_max", "_poisoned", "_position")

    def __init__(self, frame_bytes_max: int, receive_bytes_max: int) -> None:
        if frame_bytes_max < _LENGTH_MIN:
            raise ValueError(
                f"frame_bytes_max must be at least {_LENGTH_MIN}, got {frame_bytes_max}"
            )
        self._frame_bytes_max = frame_bytes_max
        self._buffer_bytes_max = frame_bytes_max + 4 + receive_bytes_max
        self._buffer = b""
        self._position = 0
        self._poisoned: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet decoded."""
        return len(self._buffer) - self._position

    def receive_data(self, data: bytes) -> None:
        """Append bytes from the peer (any split: frames may straddle calls)."""
        if not data:
            return
        pending = len(self._buffer) - self._position
        if pending + len(data) > self._buffer_bytes_max:
            raise RuntimeError(
                f"decoder buffer would hold {pending + len(data)} bytes, over its bound of "
                f"{self._buffer_bytes_max}: take the complete frames before feeding more"
            )
        if pending == 0:
            self._buffer = data  # the common case: no copy
        else:
            self._buffer = self._buffer[self._position :] + data
        self._position = 0

    def _too_large(self, length: int, position: int) -> ProtocolError:
        request_id = None
        opcode = 0
        if len(self._buffer) - position >= _HEADER_BYTES:
            header = frames.HEADER.unpack_from(self._buffer, position)
            opcode, request_id = header[2], header[5]
        return ProtocolError(
            f"frame of {length} bytes exceeds this peer's limit of {self._frame_bytes_max} "
            "bytes (frame_bytes_max); send smaller entries or raise the limit on both sides",
            status=frames.Status.TOO_LARGE,
            request_id=request_id,
            opcode=opcode,
        )

    def _consumed(self, position: int) -> None:
        """Decoding took the buffer up to `position`; an emptied buffer is dropped."""
        if position == len(self._buffer):
            self._buffer = b""
            self._position = 0
        else:
            self._position = position

    def _poison(self, error: ProtocolError) -> None:
        """Fail from now on with `error`, dropping what is buffered."""
        self._poisoned = error
        self._buffer = b""
        self._position = 0

    def _fail(self, error: ProtocolError, decoded: list[_Decoded]) -> list[_Decoded]:
        """Give out the good frames before a bad one; the next call raises `error`.

        After a bad frame the stream has no trustworthy frame boundary: the decoder
        stays failed and drops what it holds.
        """
        self._poison(error)
        if decoded:
            return decoded
        raise error


def _short_frame(length: int) -> ProtocolError:
    return ProtocolError(
        f"frame length {length} is below the header's {_LENGTH_MIN} bytes", status=_BAD_REQUEST
    )


def _bad_add_response(request_id: int, version: int, flags: int) -> ProtocolError:
    return ProtocolError(
        f"bad ADD_ENTRY response {request_id}: version {version}, flags 0x{flags:02x}",
        status=_BAD_REQUEST,
        request_id=request_id,
    )


class RequestDecoder(_FrameBuffer):
    """The server side: bytes in, request messages out.

    A connection speaks one protocol version, that of its first frame (any of
    PROTOCOL_VERSIONS_SERVED); `version` says which once a frame has come, and the
    server answers in it. A frame of another version fails the stream.
    """

    __slots__ = ("version",)

    def __init__(
        self,
        frame_bytes_max: int = frames.FRAME_BYTES_MAX_DEFAULT,
        receive_bytes_max: int = RECEIVE_BYTES_DEFAULT,
    ) -> None:
        super().__init__(frame_bytes_max, receive_bytes_max)
        #: the connection's protocol version (None until its first frame came)
        self.version: int | None = None

    def next_requests(self, count_max: int) -> list[RequestMessage | Refused]:
        """Every complete request buffered, up to `count_max`, in order.

        Raises ProtocolError for a frame that is not a valid request (its
        `request_id` says which, when known), once the good requests before it
        were returned; the decoder then stays failed, since the stream's framing
        can no longer be trusted.
        """
        return [
            AddEntry(*item) if isinstance(item, tuple) else item
            for item in self.next_requests_raw(count_max)
        ]

    def next_requests_raw(self, count_max: int) -> list[RequestMessage | WireAdd | Refused]:
        """As `next_requests`, but each ADD_ENTRY comes as a plain `WireAdd` tuple.

        The server's hot path: a tuple costs a fraction of a message object, and
        adds are most of what a busy node decodes.
        """
        if self._poisoned is not None:
            raise self._poisoned
        buf = self._buffer
        pos = self._position
        end = len(buf)
        out: list[RequestMessage | WireAdd | Refused] = []
        frame_max = self._frame_bytes_max
        v = self.version
        if v is None:
            v = self._pin_version(buf, pos, end)
        add_unpack = frames.ADD_REQUEST.unpack_from
        add_fixed = frames.ADD_REQUEST.size
        add_op = int(frames.Opcode.ADD_ENTRY)
        recovery = int(frames.Flag.RECOVERY)
        try:
            while len(out) < count_max and end - pos >= 4:
                (length,) = _U32.unpack_from(buf, pos)
                if length > frame_max:
                    raise self._too_large(length, pos)
                if length < _LENGTH_MIN:
                    raise _short_frame(length)
                frame_end = pos + 4 + length
                if frame_end > end:
                    break
                if buf[pos + 5] == add_op and length >= add_fixed - 4:
                    # the hot path: header and fixed body in one call
                    _, version, _, flags, status, rid, lid, eid, lac, klen = add_unpack(buf, pos)
                    key_end = pos + add_fixed + klen
                    if version != v or flags & ~recovery or status or key_end > frame_end:
                        raise _invalid_add(version, v, flags, status, rid, key_end > frame_end)
                    out.append(
                        (
                            rid,
                            lid,
                            eid,
                            lac,
                            buf[pos + add_fixed : key_end] if klen else b"",
                            buf[key_end:frame_end],
                            flags == recovery,
                        )
                    )
                elif buf[pos + 5] == _OP_RUN and length >= _RUN_FIXED - 4:
                    out.append(_decode_add_run(buf, pos, frame_end, v))
                else:
                    out.append(_decode_request(buf, pos, frame_end, v))
                pos = frame_end
        except ProtocolError as error:
            return self._fail(error, out)
        except struct.error as error:  # a fixed part longer than the frame: bad request
            return self._fail(ProtocolError(f"malformed frame: {error}", status=_BAD_REQUEST), out)
        self._consumed(pos)
        return out

    def _pin_version(self, buf: bytes, pos: int, end: int) -> int:
        """The version of the connection's first frame, pinned for all that follow
        once its version byte is in; the newest until then."""
        if end - pos < 5:
            return _VERSION_NEWEST  # (no frame is complete yet: nothing is decoded in it)
        # a version not served pins the newest: the frame is refused by name
        version = buf[pos + 4] if buf[pos + 4] in _SERVED else _VERSION_NEWEST
        self.version = version
        return version


def _wrong_version(version: int, connection_version: int) -> str:
    if version not in _SERVED:
        return f"protocol version {version}; this node speaks versions {_SERVED_TEXT}"
    return (
        f"protocol version {version} on a connection that began with version "
        f"{connection_version}; one connection speaks one version"
    )


def _invalid_add(
    version: int,
    connection_version: int,
    flags: int,
    status: int,
    request_id: int,
    key_overflows: bool,
) -> ProtocolError:
    if version != connection_version:
        reason = _wrong_version(version, connection_version)
    elif status:
        reason = f"a request carries status {status}; requests carry 0"
    elif flags & ~int(frames.Flag.RECOVERY):
        reason = f"ADD_ENTRY with unknown flags 0x{flags:02x}"
    else:
        reason = "ADD_ENTRY master key runs past the end of the frame" if key_overflows else "?"
    return ProtocolError(
        f"bad request {request_id}: {reason}",
        status=_BAD_REQUEST,
        request_id=request_id,
        opcode=frames.Opcode.ADD_ENTRY,
    )


def _decode_add_run(buf: bytes, pos: int, frame_end: int, connection_version: int) -> AddRun:
    """An ADD_RUN frame: every size read in one call, every payload sliced in one
    comprehension; no Python step per entry beyond its slice."""
    _, version, _, flags, status, rid, lid, first, lac, count, klen = _RUN_UNPACK(buf, pos)
    key_end = pos + _RUN_FIXED + klen
    payloads_at = key_end + 4 * count
    if (
        version != connection_version
        or flags & ~_FLAG_RECOVERY
        or status
        or not 1 <= count <= _RUN_MAX
        or payloads_at > frame_end
    ):
        raise _invalid_run(
            version, connection_version, flags, status, rid, count, payloads_at - frame_end
        )
    sizes = _sizes_struct(count).unpack_from(buf, key_end)
    ends = list(accumulate(sizes, initial=payloads_at))
    if ends[-1] != frame_end:
        raise ProtocolError(
            f"bad request {rid}: ADD_RUN payload sizes add up to {ends[-1] - payloads_at} "
            f"bytes, but {frame_end - payloads_at} bytes of payload follow them in the frame",
            status=_BAD_REQUEST,
            request_id=rid,
            opcode=_OP_RUN,
        )
    return AddRun(
        rid,
        lid,
        first,
        lac,
        buf[pos + _RUN_FIXED : key_end] if klen else b"",
        [buf[start:end] for start, end in pairwise(ends)],
        flags == _FLAG_RECOVERY,
    )


def _invalid_run(
    version: int,
    connection_version: int,
    flags: int,
    status: int,
    request_id: int,
    count: int,
    overrun: int,
) -> ProtocolError:
    if version != connection_version:
        reason = _wrong_version(version, connection_version)
    elif status:
        reason = f"a request carries status {status}; requests carry 0"
    elif flags & ~_FLAG_RECOVERY:
        reason = f"ADD_RUN with unknown flags 0x{flags:02x}"
    elif not 1 <= count <= _RUN_MAX:
        reason = f"ADD_RUN of {count} entries; a run carries 1 to {_RUN_MAX}"
    else:
        reason = f"ADD_RUN master key and payload sizes run {overrun} bytes past the frame"
    return ProtocolError(
        f"bad request {request_id}: {reason}",
        status=_BAD_REQUEST,
        request_id=request_id,
        opcode=_OP_RUN,
    )


class _RequestFrame:
    """One request frame other than an add, its header read and checked: what each
    opcode's decoder reads its body from, and how it says the frame is bad."""

    __slots__ = ("body", "buf", "end", "flags", "opcode", "request_id", "version")

    def __init__(
        self, buf: bytes, body: int, end: int, version: int, opcode: int, flags: int, rid: int
    ) -> None:
        self.buf = buf
        self.body = body
        self.end = end
        self.version = version
        self.opcode = opcode
        self.flags = flags
        self.request_id = rid

    def bad(self, reason: str) -> ProtocolError:
        return ProtocolError(
            f"bad request {self.request_id}: {reason}",
            status=_BAD_REQUEST,
            request_id=self.request_id,
            opcode=self.opcode,
        )

    def fixed(
        self, layout: struct.Struct, allow_flags: int = 0, tail: bool = False
    ) -> tuple[int, ...]:
        """The body's fixed part (all of the body unless `tail`), its flags checked."""
        name = frames.Opcode(self.opcode).name
        if self.flags & ~allow_flags:
            raise self.bad(f"{name} with unknown flags 0x{self.flags:02x}")
        body_bytes = self.end - self.body
        if body_bytes < layout.size or (not tail and body_bytes != layout.size):
            raise self.bad(
                f"{name} body of {body_bytes} bytes; expected "
                f"{'at least ' if tail else ''}{layout.size}"
            )
        return layout.unpack_from(self.buf, self.body)

    def key(self, layout: struct.Struct, length: int) -> bytes:
        """The master key after the fixed part `layout`: the rest of the frame."""
        start = self.body + layout.size
        if start + length != self.end:
            raise self.bad(f"{frames.Opcode(self.opcode).name} master key does not end the frame")
        return self.buf[start : self.end]


def _decode_short_add(frame: _RequestFrame) -> RequestMessage | Refused:
    # the fast paths read every add frame long enough to unpack
    fixed_bytes = (
        frames.ADD_REQUEST_FIXED.size
        if frame.opcode == frames.Opcode.ADD_ENTRY
        else frames.ADD_RUN_REQUEST_FIXED.size
    )
    name = frames.Opcode(frame.opcode).name
    raise frame.bad(
        f"{name} body of {frame.end - frame.body} bytes; expected at least {fixed_bytes}"
    )


def _decode_read_entry(frame: _RequestFrame) -> RequestMessage | Refused:
    layout = frames.READ_ENTRY_REQUEST
    lid, eid, wait_ms, klen = frame.fixed(layout, int(frames.Flag.FENCE), tail=True)
    master_key = frame.key(layout, klen)
    if klen > MASTER_KEY_BYTES_MAX:
        return _key_too_long(frame.request_id, frame.opcode, lid, klen)
    fence = bool(frame.flags & frames.Flag.FENCE)
    return ReadEntry(frame.request_id, lid, eid, wait_ms, fence, master_key)


def _decode_read_range(frame: _RequestFrame) -> RequestMessage | Refused:
    lid, first, last, max_entries, max_bytes = frame.fixed(frames.READ_RANGE_REQUEST)
    return ReadRange(frame.request_id, lid, first, last, max_entries, max_bytes)


def _decode_read_lac(frame: _RequestFrame) -> RequestMessage | Refused:
    (lid,) = frame.fixed(frames.LEDGER_ONLY)
    return ReadLac(frame.request_id, lid)


def _decode_fence(frame: _RequestFrame) -> RequestMessage | Refused:
    lid, klen = frame.fixed(frames.FENCE_REQUEST, tail=True)
    master_key = frame.key(frames.FENCE_REQUEST, klen)
    if klen > MASTER_KEY_BYTES_MAX:
        return _key_too_long(frame.request_id, frame.opcode, lid, klen)
    return Fence(frame.request_id, lid, master_key)


def _decode_close(frame: _RequestFrame) -> RequestMessage | Refused:
    lid, last, klen = frame.fixed(frames.CLOSE_REQUEST, tail=True)
    master_key = frame.key(frames.CLOSE_REQUEST, klen)
    if klen > MASTER_KEY_BYTES_MAX:
        return _key_too_long(frame.request_id, frame.opcode, lid, klen)
    last_entry_id = None if last == frames.CLOSE_AT_LAST_STORED else last
    return Close(frame.request_id, lid, last_entry_id, master_key)


def _decode_delete(frame: _RequestFrame) -> RequestMessage | Refused:
    if frame.version < _DELETE_KEYED_SINCE:
        (lid,) = frame.fixed(frames.LEDGER_ONLY)
        return Refused(
            frame.request_id,
            frame.opcode,
            _BAD_REQUEST,
            f"DELETE of ledger {lid} in protocol version {frame.version} carries no master "
            f"key and is refused: deleting a ledger takes its key since version "
            f"{_DELETE_KEYED_SINCE}. Upgrade the client and pass the ledger's password",
        )
    lid, klen = frame.fixed(frames.DELETE_REQUEST, tail=True)
    master_key = frame.key(frames.DELETE_REQUEST, klen)
    if klen > MASTER_KEY_BYTES_MAX:
        return _key_too_long(frame.request_id, frame.opcode, lid, klen)
    return Delete(frame.request_id, lid, master_key)


def _decode_list_ledgers(frame: _RequestFrame) -> RequestMessage | Refused:
    after, max_count = frame.fixed(frames.LIST_REQUEST)
    return ListLedgers(frame.request_id, after, max_count)


def _decode_info(frame: _RequestFrame) -> RequestMessage | Refused:
    frame.fixed(_EMPTY)
    return Info(frame.request_id)


#: Each opcode's request decoder (adds and runs have their fast paths, and come
#: here only when too short to unpack): one entry per message type.
_REQUEST_DECODERS: Final[dict[int, Callable[[_RequestFrame], RequestMessage | Refused]]] = {
    frames.Opcode.ADD_ENTRY: _decode_short_add,
    frames.Opcode.ADD_RUN: _decode_short_add,
    frames.Opcode.READ_ENTRY: _decode_read_entry,
    frames.Opcode.READ_RANGE: _decode_read_range,
    frames.Opcode.READ_LAC: _decode_read_lac,
    frames.Opcode.FENCE: _decode_fence,
    frames.Opcode.CLOSE: _decode_close,
    frames.Opcode.DELETE: _decode_delete,
    frames.Opcode.LIST_LEDGERS: _decode_list_ledgers,
    frames.Opcode.INFO: _decode_info,
}


def _decode_request(
    buf: bytes, pos: int, frame_end: int, connection_version: int
) -> RequestMessage | Refused:
    _, version, opcode, flags, status, rid = frames.HEADER.unpack_from(buf, pos)
    frame = _RequestFrame(buf, pos + _HEADER_BYTES, frame_end, version, opcode, flags, rid)
    if version != connection_version:
        raise frame.bad(_wrong_version(version, connection_version))
    if status:
        raise frame.bad(f"a request carries status {status}; requests carry 0")
    if flags & _RESPONSE:
        raise frame.bad("the response flag is set on a request")
    decode = _REQUEST_DECODERS.get(opcode)
    if decode is None:
        raise frame.bad(f"unknown opcode {opcode}")
    return decode(frame)


def _key_too_long(request_id: int, opcode: int, ledger_id: int, key_bytes: int) -> Refused:
    """A well-formed frame whose master key no ledger can have: refused alone, before
    it reaches the node (which would otherwise fix that key on the ledger for good)."""
    return Refused(
        request_id,
        opcode,
        int(frames.Status.INVALID_ARGUMENT),
        f"{frames.Opcode(opcode).name} of ledger {ledger_id}: a master key of {key_bytes} bytes; "
        f"a ledger's master key has at most {MASTER_KEY_BYTES_MAX} bytes (derive one with "
        "master_key_from_password)",
    )


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
    return ReadRangeResponse(rid, ledger_id, lac, entries)


def _decode_lac_response(buf: bytes, rid: int, flags: int, body: int, end: int) -> LacResponse:
    return LacResponse(rid, *frames.LEDGER_AND_VALUE.unpack_from(buf, body))


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
    kind = _OK_RESPONSES.get(opcode)
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
