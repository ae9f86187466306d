"""Requests from bytes to messages: the bounded `RequestDecoder` (the server's
side), with one decoder per opcode. Their encoders (the client's side) are
request_encoding.py.

Speed: one `unpack_from` per add frame (header and fixed body together), payloads
sliced once from the receive buffer, adds handed on as plain tuples (`WireAdd`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from itertools import accumulate, pairwise
from typing import Final

from netio import frames
from netio.errors import ProtocolError
from netio.framing import (
    _BAD_REQUEST,
    _DELETE_KEYED_SINCE,
    _EMPTY,
    _FLAG_RECOVERY,
    _HEADER_BYTES,
    _LENGTH_MIN,
    _OP_RUN,
    _RESPONSE,
    _RUN_FIXED,
    _RUN_MAX,
    _RUN_UNPACK,
    _SERVED,
    _SERVED_TEXT,
    _U32,
    _V4,
    _VERSION_NEWEST,
    RECEIVE_BYTES_DEFAULT,
    _FrameBuffer,
    _short_frame,
    _sizes_struct,
)
from netio.messages import (
    AddBatch,
    AddEntry,
    AddRun,
    Close,
    Delete,
    Fence,
    Info,
    ListLedgers,
    ReadEntry,
    ReadLac,
    ReadRange,
    Refused,
    RequestMessage,
    WireAdd,
    WriteLac,
)
from netio.security import MASTER_KEY_BYTES_MAX


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
    if frame.version < _V4:
        lid, first, last, max_entries, max_bytes = frame.fixed(frames.READ_RANGE_REQUEST)
        return ReadRange(frame.request_id, lid, first, last, max_entries, max_bytes)
    layout = frames.READ_RANGE_REQUEST_V4
    lid, first, last, max_entries, max_bytes, klen = frame.fixed(
        layout, int(frames.Flag.FENCE), tail=True
    )
    master_key = frame.key(layout, klen)
    if klen > MASTER_KEY_BYTES_MAX:
        return _key_too_long(frame.request_id, frame.opcode, lid, klen)
    fence = bool(frame.flags & frames.Flag.FENCE)
    return ReadRange(frame.request_id, lid, first, last, max_entries, max_bytes, fence, master_key)


def _decode_read_lac(frame: _RequestFrame) -> RequestMessage | Refused:
    if frame.version < _V4:
        (lid,) = frame.fixed(frames.LEDGER_ONLY)
        return ReadLac(frame.request_id, lid)
    layout = frames.READ_LAC_REQUEST_V4
    allowed = int(frames.Flag.FENCE | frames.Flag.ENTRY)
    lid, known_lac, wait_ms, klen = frame.fixed(layout, allowed, tail=True)
    master_key = frame.key(layout, klen)
    if klen > MASTER_KEY_BYTES_MAX:
        return _key_too_long(frame.request_id, frame.opcode, lid, klen)
    fence = bool(frame.flags & frames.Flag.FENCE)
    with_entry = bool(frame.flags & frames.Flag.ENTRY)
    return ReadLac(frame.request_id, lid, known_lac, wait_ms, fence, master_key, with_entry)


def _decode_write_lac(frame: _RequestFrame) -> RequestMessage | Refused:
    layout = frames.WRITE_LAC_REQUEST
    lid, lac, klen = frame.fixed(layout, tail=True)
    master_key = frame.key(layout, klen)
    if klen > MASTER_KEY_BYTES_MAX:
        return _key_too_long(frame.request_id, frame.opcode, lid, klen)
    return WriteLac(frame.request_id, lid, lac, master_key)


def _decode_add_batch(frame: _RequestFrame) -> RequestMessage | Refused:
    """An ADD_BATCH frame. A bad count or sizes that do not fill the frame break the
    framing (BAD_REQUEST, the connection closes); ids that do not strictly increase
    are a bad value in a well-framed request (INVALID_ARGUMENT, the stream goes on)."""
    layout = frames.ADD_BATCH_REQUEST_FIXED
    lid, lac, count, klen = frame.fixed(layout, _FLAG_RECOVERY, tail=True)
    if not 1 <= count <= _RUN_MAX:
        raise frame.bad(f"ADD_BATCH of {count} entries; a batch carries 1 to {_RUN_MAX}")
    key_end = frame.body + layout.size + klen
    items_end = key_end + frames.BATCH_ITEM.size * count
    if items_end > frame.end:
        raise frame.bad(
            f"ADD_BATCH master key and entry ids run {items_end - frame.end} bytes past the frame"
        )
    buf = frame.buf
    pairs = struct.unpack_from(">" + "qI" * count, buf, key_end)
    entry_ids = list(pairs[0::2])
    ends = list(accumulate(pairs[1::2], initial=items_end))
    if ends[-1] != frame.end:
        raise frame.bad(
            f"ADD_BATCH payload sizes add up to {ends[-1] - items_end} bytes, but "
            f"{frame.end - items_end} bytes of payload follow them in the frame"
        )
    if klen > MASTER_KEY_BYTES_MAX:
        return _key_too_long(frame.request_id, frame.opcode, lid, klen)
    if any(a >= b for a, b in pairwise(entry_ids)):
        return Refused(
            frame.request_id,
            frame.opcode,
            int(frames.Status.INVALID_ARGUMENT),
            f"ADD_BATCH of ledger {lid}: entry ids must strictly increase, got "
            f"{entry_ids[:8]}{'...' if count > 8 else ''}; send each id once, in order",
        )
    return AddBatch(
        frame.request_id,
        lid,
        lac,
        buf[frame.body + layout.size : key_end],
        entry_ids,
        [buf[start:end] for start, end in pairwise(ends)],
        frame.flags == _FLAG_RECOVERY,
    )


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
#: Opcodes that exist from version 4 on (an older connection does not know them).
_REQUEST_DECODERS_V4: Final[dict[int, Callable[[_RequestFrame], RequestMessage | Refused]]] = {
    frames.Opcode.ADD_BATCH: _decode_add_batch,
    frames.Opcode.WRITE_LAC: _decode_write_lac,
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
    if decode is None and version >= _V4:
        decode = _REQUEST_DECODERS_V4.get(opcode)
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
