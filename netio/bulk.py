"""Bulk encoders and decoders for load generators (`pora bench`): many add frames
encoded once, many OK add responses checked at once.

`RepeatedAddFrames` and `RepeatedRunFrames` encode a payload's frames once and
rewrite only their ids; `AddOutcomeDecoder.next_add_outcomes` checks runs of OK
add responses in bulk and gives back their request ids, with no object per
response. Every frame is byte for byte what `netio.codec` makes and reads.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Final, NamedTuple, Protocol

from netio import frames
from netio.errors import ProtocolError
from netio.framing import (
    _ADD_LENGTH_BASE,
    _ADD_PACK,
    _BAD_REQUEST,
    _FLAG_RECOVERY,
    _HEADER_BYTES,
    _LENGTH_MIN,
    _OP_ADD,
    _RESPONSE,
    _RUN_MAX,
    _U32,
    _VERSION_NEWEST,
    RECEIVE_BYTES_DEFAULT,
    _bad_add_response,
    _check_key,
    _short_frame,
)
from netio.messages import ResponseMessage
from netio.request_encoding import encode_add_entry, encode_add_run
from netio.response_codec import ResponseDecoder, _decode_response

#: An OK ADD_ENTRY response: its first 8 bytes (length 28, version, opcode, RESPONSE
#: flag, status OK) never vary within a version (a ResponseDecoder keeps them, and
#: the same read as a native-endian u64, as `array("Q")` reads it); the request id
#: follows, then ledger and entry id.
_ADD_OK_BYTES: Final = frames.ADD_RESPONSE_BYTES
#: u64 words per OK add response: prefix, request id, ledger id, entry id
_ADD_OK_WORDS: Final = _ADD_OK_BYTES // 8
#: frames checked in one bulk step at most; after a run broken by another response,
#: steps start again this small and double while all are OK, so that a stream
#: mixing OK adds with other responses costs no more than frame by frame
_ADD_OK_RUN_MAX: Final = 2048
_ADD_OK_RUN_AFTER_BREAK: Final = 16
_NATIVE_LITTLE_ENDIAN: Final = sys.byteorder == "little"
if array("Q").itemsize != 8:  # pragma: no cover (true of every CPython platform)
    raise ImportError("netio.bulk needs array('Q') items of 8 bytes")


def encode_add_entries(
    first_request_id: int,
    ledger_id: int,
    entries: Sequence[tuple[int, bytes]],
    *,
    master_key: bytes = b"",
    last_add_confirmed: int = -1,
    recovery: bool = False,
) -> bytes:
    """ADD_ENTRY frames for many `(entry_id, payload)` of one ledger, with request ids
    `first_request_id`, `first_request_id + 1`, ..., joined into one buffer."""
    key_bytes = len(master_key)
    _check_key(master_key)
    base = _ADD_LENGTH_BASE + key_bytes
    flags = _FLAG_RECOVERY if recovery else 0
    pack = _ADD_PACK
    parts: list[bytes] = []
    append = parts.append
    request_id = first_request_id
    for entry_id, payload in entries:
        append(
            pack(
                base + len(payload),
                _VERSION_NEWEST,
                _OP_ADD,
                flags,
                0,
                request_id,
                ledger_id,
                entry_id,
                last_add_confirmed,
                key_bytes,
            )
        )
        if key_bytes:
            append(master_key)
        append(payload)
        request_id += 1
    return b"".join(parts)


#: request id, ledger id, first entry id: the fields of an ADD_RUN frame after its first 8
_RUN_IDS: Final = struct.Struct(">Qqq")


class RepeatedRunFrames:
    """ADD_RUN frames of one payload repeated, to one ledger, for a load generator.

    The frame of each run length (1 to `capacity` entries) is encoded once, on first
    use; each `frame` call then writes only its request id and first entry id into
    it. The frames are byte for byte those of `encode_add_run`.
    """

    __slots__ = ("_frames", "_key", "_lac", "_ledger_id", "_payload", "_recovery", "capacity")

    def __init__(
        self,
        ledger_id: int,
        payload: bytes,
        capacity: int,
        *,
        master_key: bytes = b"",
        last_add_confirmed: int = -1,
        recovery: bool = False,
    ) -> None:
        if not 1 <= capacity <= _RUN_MAX:
            raise ValueError(f"capacity must be in [1, {_RUN_MAX}], got {capacity}")
        _check_key(master_key)
        self._ledger_id = ledger_id
        self._payload = payload
        self._key = master_key
        self._lac = last_add_confirmed
        self._recovery = recovery
        self.capacity = capacity
        self._frames: dict[int, bytearray] = {}

    def frame(self, request_id: int, first_entry_id: int, count: int) -> bytearray:
        """The frame of a run of `count` entries from `first_entry_id`. The buffer is
        this object's: send it before the next call for the same count."""
        frame = self._frames.get(count)
        if frame is None:
            if not 1 <= count <= self.capacity:
                raise ValueError(f"count must be in [1, {self.capacity}], got {count}")
            frame = self._frames[count] = bytearray(
                encode_add_run(
                    0,
                    self._ledger_id,
                    0,
                    [self._payload] * count,
                    master_key=self._key,
                    last_add_confirmed=self._lac,
                    recovery=self._recovery,
                )
            )
        _RUN_IDS.pack_into(frame, 8, request_id, self._ledger_id, first_entry_id)
        return frame


#: request id, ledger id, entry id: the fields of an add frame after its first 8 bytes
_ADD_IDS: Final = struct.Struct(">Qqq")
_ADD_IDS_OFFSET: Final = 8


class RepeatedAddFrames:
    """ADD_ENTRY frames of one payload to one ledger, encoded once for `capacity` frames.

    Each `frames` call writes only the request and entry ids into the ready-made
    buffer (one small `pack_into` per frame) instead of packing and joining every
    frame afresh: for a load generator (`pora bench`) sending the same payload over
    and over. The frames are byte for byte those of `encode_add_entries`.
    """

    __slots__ = ("_buffer", "_ledger_id", "capacity", "frame_bytes")

    def __init__(
        self,
        ledger_id: int,
        payload: bytes,
        capacity: int,
        *,
        master_key: bytes = b"",
        last_add_confirmed: int = -1,
        recovery: bool = False,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        frame = encode_add_entry(
            0,
            ledger_id,
            0,
            payload,
            master_key=master_key,
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
        )
        self._ledger_id = ledger_id
        self.capacity = capacity
        self.frame_bytes = len(frame)
        self._buffer = bytearray(frame * capacity)

    def frames(self, first_request_id: int, first_entry_id: int, count: int) -> memoryview:
        """`count` frames, request ids `first_request_id`, `first_request_id + 1`, ...
        and entry ids `first_entry_id`, ... likewise.

        The view is into this object's buffer: send it before the next call, which
        overwrites it.
        """
        if not 0 <= count <= self.capacity:
            raise ValueError(f"count must be in [0, {self.capacity}], got {count}")
        buffer = self._buffer
        pack_into = _ADD_IDS.pack_into
        ledger_id = self._ledger_id
        size = self.frame_bytes
        offset = _ADD_IDS_OFFSET
        for index in range(count):
            pack_into(buffer, offset, first_request_id + index, ledger_id, first_entry_id + index)
            offset += size
        return memoryview(buffer)[: count * size]


class EntryIds(Protocol):
    """Anything naming an entry: the engine's journal request, an AddEntry message."""

    ledger_id: int
    entry_id: int


def encode_add_responses(
    request_ids: Sequence[int], entries: Sequence[EntryIds], version: int = _VERSION_NEWEST
) -> bytearray:
    """OK responses to many adds, packed into one buffer (one `send_all` for all)."""
    count = len(request_ids)
    out = bytearray(count * frames.ADD_RESPONSE_BYTES)
    pack = frames.ADD_RESPONSE.pack_into
    length = frames.ADD_RESPONSE_BYTES - 4
    op = int(frames.Opcode.ADD_ENTRY)
    offset = 0
    for i in range(count):
        entry = entries[i]
        pack(
            out,
            offset,
            length,
            version,
            op,
            _RESPONSE,
            0,
            request_ids[i],
            entry.ledger_id,
            entry.entry_id,
        )
        offset += frames.ADD_RESPONSE_BYTES
    return out


class AddOutcomes(NamedTuple):
    """What `ResponseDecoder.next_add_outcomes` took from the buffer, in arrival order
    within each list."""

    #: request ids of the OK ADD_ENTRY responses
    ok_request_ids: list[int]
    #: every other response: ErrorResponse for failures (of any opcode), or the
    #: message of an OK response to some other request
    others: list[ResponseMessage]


class AddOutcomeDecoder(ResponseDecoder):
    """A ResponseDecoder with a lean path for a pipelined add load."""

    __slots__ = ("_ok_prefix", "_ok_prefix_word")

    def __init__(
        self,
        frame_bytes_max: int = frames.FRAME_BYTES_MAX_DEFAULT,
        receive_bytes_max: int = RECEIVE_BYTES_DEFAULT,
        version: int = _VERSION_NEWEST,
    ) -> None:
        super().__init__(frame_bytes_max, receive_bytes_max, version)
        self._ok_prefix = frames.HEADER.pack(_ADD_OK_BYTES - 4, version, _OP_ADD, _RESPONSE, 0, 0)[
            :8
        ]
        self._ok_prefix_word = int.from_bytes(self._ok_prefix, sys.byteorder)

    def next_add_outcomes(self) -> AddOutcomes:
        """Every complete response buffered, as `next_responses` reads them, but OK
        ADD_ENTRY responses come as bare request ids: a pipelined add load's lean path.

        OK add responses are fixed 32-byte frames whose first 8 bytes never vary, so a
        run of them is checked and its request ids read in bulk (`array` operations in
        C, no object per response). Any other frame is decoded one by one as
        `next_responses` does. An ADD_ENTRY response with status OK that is not a
        well-formed 32-byte OK add response (wrong length, version or flags) is a
        ProtocolError, never a success; so is anything `next_responses` refuses, and
        the decoder then stays failed, as there.
        """
        if self._poisoned is not None:
            raise self._poisoned
        buf = self._buffer
        pos = self._position
        end = len(buf)
        ok: list[int] = []
        others: list[ResponseMessage] = []
        frame_max = self._frame_bytes_max
        bulk = frame_max >= _ADD_OK_BYTES - 4  # else an OK add frame is over the limit
        run_max = _ADD_OK_RUN_MAX
        ok_prefix = self._ok_prefix
        ok_word = self._ok_prefix_word
        view = memoryview(buf)
        try:
            while end - pos >= 4:
                if bulk and buf[pos : pos + 8] == ok_prefix:
                    run = min((end - pos) // _ADD_OK_BYTES, run_max)
                    if run:
                        good, run_max = _take_ok_adds(view, pos, run, run_max, ok_word, ok)
                        pos += good * _ADD_OK_BYTES
                        continue
                (length,) = _U32.unpack_from(buf, pos)
                if length > frame_max:
                    raise self._too_large(length, pos)
                if length < _LENGTH_MIN:
                    raise _short_frame(length)
                frame_end = pos + 4 + length
                if frame_end > end:
                    break
                if buf[pos + 5] == _OP_ADD and buf[pos + 7] == 0:
                    raise _malformed_ok_add(buf, pos, length)
                others.append(_decode_response(buf, pos, frame_end, self.version))
                pos = frame_end
        except ProtocolError as error:
            return self._fail_outcomes(error, ok, others)
        except (struct.error, ValueError, KeyError) as error:
            failure = ProtocolError(f"malformed response: {error}", status=_BAD_REQUEST)
            return self._fail_outcomes(failure, ok, others)
        finally:
            view.release()
        self._consumed(pos)
        return AddOutcomes(ok, others)

    def _fail_outcomes(
        self, error: ProtocolError, ok: list[int], others: list[ResponseMessage]
    ) -> AddOutcomes:
        """As `_fail`: the outcomes before the bad frame, or `error` if there are none."""
        self._poison(error)
        if ok or others:
            return AddOutcomes(ok, others)  # the next call raises `error`
        raise error


def _take_ok_adds(
    view: memoryview, pos: int, run: int, run_max: int, ok_word: int, ok: list[int]
) -> tuple[int, int]:
    """Check the `run` frames at `pos` as OK add responses in bulk; append the request
    ids of those that lead to `ok`. Returns how many led, and the next step's most
    frames (`run_max` doubled after a clean step, small again after a break)."""
    words = array("Q")
    words.frombytes(view[pos : pos + run * _ADD_OK_BYTES])
    prefixes = words[::_ADD_OK_WORDS]
    if prefixes.count(ok_word) == run:
        good = run
        run_max = min(run_max * 2, _ADD_OK_RUN_MAX)
    else:
        good = _leading_run(prefixes, ok_word)
        run_max = _ADD_OK_RUN_AFTER_BREAK
    request_ids = words[1 : good * _ADD_OK_WORDS : _ADD_OK_WORDS]
    if _NATIVE_LITTLE_ENDIAN:
        request_ids.byteswap()  # the wire is big-endian
    ok += request_ids.tolist()
    return good, run_max


def _leading_run(values: array[int], value: int) -> int:
    """How many of `values` from the start equal `value`."""
    for index, item in enumerate(values):
        if item != value:
            return index
    return len(values)


def _malformed_ok_add(buf: bytes, pos: int, length: int) -> ProtocolError:
    """An OK ADD_ENTRY response whose first 8 bytes are not the fixed ones."""
    _, version, _, flags, _, request_id = frames.HEADER.unpack_from(buf, pos)
    if length != _ADD_OK_BYTES - 4:
        return ProtocolError(
            f"bad ADD_ENTRY response {request_id}: status OK with a body of "
            f"{length - _LENGTH_MIN} bytes; an OK add response's body is "
            f"{_ADD_OK_BYTES - _HEADER_BYTES} bytes (ledger id, entry id)",
            status=_BAD_REQUEST,
            request_id=request_id,
        )
    return _bad_add_response(request_id, version, flags)
