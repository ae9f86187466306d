"""What both directions of the codec share: the constants of frames, the header,
and the bounded receive buffer of the decoders (`netio.requests`,
`netio.responses`)."""

from __future__ import annotations

import struct
from typing import Final, TypeVar

from netio import frames
from netio.errors import ProtocolError
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
_SERVED_TEXT: Final = ", ".join(str(version) for version in _SERVED[:-1]) + f" and {_SERVED[-1]}"
#: the version that first carried the CORRUPT status; older peers get INTERNAL_ERROR
_CORRUPT_SINCE: Final = 3
#: the version whose DELETE carries the ledger's master key; older ones are refused
_DELETE_KEYED_SINCE: Final = 3
#: the version of ADD_BATCH, WRITE_LAC, INFO's instance id, and the keyed, long-polling
#: READ_LAC and READ_RANGE bodies
_V4: Final = 4


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
