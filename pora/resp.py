"""A minimal RESP2 encoder and incremental reply counter, for the Redis benchmark.

Only what a pipelined `XADD` load needs: encode a command once, then count
replies as bytes arrive (simple strings, errors, integers, bulk strings, and
arrays of those), keeping incomplete ones buffered. Sans-io, like netio.

Speed: XADD replies are bulk strings of the new entry's id, and consecutive ones
mostly have the same length; a run of bulk strings of one length is checked and
counted with a few strided slices (C loops), not reply by reply. Anything else
goes through the general parser.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

REPLY_BYTES_MAX: Final = 64 << 20
_SIMPLE, _ERROR, _INTEGER, _BULK, _ARRAY = b"+-:$*"
#: a bulk string header `$<digits>\r\n` longer than this is left to the general parser
_BULK_HEADER_BYTES_MAX: Final = 24
#: run layouts remembered (one per bulk length seen; XADD ids have a handful)
_RUN_LAYOUTS_MAX: Final = 64


class RespError(Exception):
    """The server sent something that is not RESP2, or a reply too large."""


def encode_command(arguments: Sequence[bytes]) -> bytes:
    """`*N\\r\\n` then `$len\\r\\narg\\r\\n` for each argument."""
    parts = [b"*%d\r\n" % len(arguments)]
    for argument in arguments:
        parts.append(b"$%d\r\n%s\r\n" % (len(argument), argument))
    return b"".join(parts)


@dataclass
class ReplyCounter:
    """Feed bytes, get how many whole replies they completed (and the errors)."""

    buffer: bytearray = field(default_factory=bytearray)
    #: error replies seen (`-ERR ...`), most recent last, at most 16 kept
    errors: list[str] = field(default_factory=list)
    errors_total: int = 0
    #: bulk header -> (reply bytes, (offset, byte) each reply of that length has)
    _run_layouts: dict[bytes, tuple[int, tuple[tuple[int, bytes], ...]]] = field(
        default_factory=dict, repr=False
    )

    def feed(self, data: bytes) -> int:
        self.buffer += data
        if len(self.buffer) > REPLY_BYTES_MAX:
            raise RespError(f"a reply is over {REPLY_BYTES_MAX} bytes")
        count = 0
        position = 0
        while True:
            run, position = self._skip_bulk_run(position)
            if run:
                count += run
                continue  # the next run may be of another length
            error_messages: list[str] = []
            end = self._skip_reply(position, error_messages)
            if end < 0:
                break  # errors in an incomplete array are counted once it is whole
            count += 1
            position = end
            if error_messages:
                self.errors_total += len(error_messages)
                self.errors += error_messages
                del self.errors[:-16]
        if position:
            del self.buffer[:position]
        return count

    def _skip_bulk_run(self, position: int) -> tuple[int, int]:
        """(replies, end offset) of the run of complete bulk strings starting at
        `position` that all have the first one's length; (0, position) if none.

        Replies of one length `n` sit at a fixed stride, and each has the same
        header bytes `$n\\r\\n` and `\\r\\n` after its `n` bytes: for each of those
        offsets, one strided slice of the run and an `lstrip` of the byte expected
        there say how many replies in a row have it. Exactly the replies the
        general parser would count (it reads headers the same way).
        """
        buffer = self.buffer
        if position >= len(buffer) or buffer[position] != _BULK:
            return 0, position
        line_end = buffer.find(b"\r\n", position + 1, position + _BULK_HEADER_BYTES_MAX)
        if line_end < 0:
            return 0, position
        header = bytes(buffer[position : line_end + 2])
        layout = self._run_layouts.get(header)
        if layout is None:
            digits = header[1:-2]
            if not digits.isdigit():  # nil (`$-1`) or not RESP: the general parser decides
                return 0, position
            stride = len(header) + int(digits) + 2
            checks = tuple((i, header[i : i + 1]) for i in range(len(header)))
            layout = (stride, (*checks, (stride - 2, b"\r"), (stride - 1, b"\n")))
            if len(self._run_layouts) >= _RUN_LAYOUTS_MAX:
                self._run_layouts.clear()
            self._run_layouts[header] = layout
        stride, checks = layout
        run = (len(buffer) - position) // stride
        stop = position + run * stride
        for offset, expected in checks:
            if not run:
                break
            lane = buffer[position + offset : stop : stride]
            in_a_row = len(lane) - len(lane.lstrip(expected))
            if in_a_row < run:
                run = in_a_row
                stop = position + run * stride
        return run, stop

    def _line_end(self, position: int) -> int:
        return self.buffer.find(b"\r\n", position)

    def _skip_reply(self, position: int, error_messages: list[str]) -> int:
        """End offset of the reply starting at `position`, or -1 if incomplete; the
        messages of the error replies in it (in arrays too) go to `error_messages`."""
        if position >= len(self.buffer):
            return -1
        line_end = self._line_end(position)
        if line_end < 0:
            return -1
        kind = self.buffer[position]
        header = bytes(self.buffer[position + 1 : line_end])
        after_line = line_end + 2
        if kind == _ERROR:
            error_messages.append(header.decode("utf-8", "replace"))
        if kind in (_SIMPLE, _INTEGER, _ERROR):
            return after_line
        if kind == _BULK:
            length = _integer(header, position)
            end = after_line + length + 2 if length >= 0 else after_line  # -1: nil
            return end if end <= len(self.buffer) else -1
        if kind == _ARRAY:
            items = _integer(header, position)
            cursor = after_line
            for _ in range(max(items, 0)):
                cursor = self._skip_reply(cursor, error_messages)
                if cursor < 0:
                    return -1
            return cursor
        raise RespError(f"not a RESP reply: starts with {bytes([kind])!r}")


def _integer(header: bytes, position: int) -> int:
    """The length in a bulk or array header, or RespError saying where it is not one."""
    try:
        return int(header)
    except ValueError:
        raise RespError(f"reply at buffer offset {position}: bad length {header[:32]!r}") from None
