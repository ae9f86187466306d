"""A minimal RESP2 encoder and incremental reply counter, for the Redis benchmark.

Only what a pipelined `XADD` load needs: encode a command once, then count
replies as bytes arrive (simple strings, errors, integers, bulk strings, and
arrays of those), keeping incomplete ones buffered. Sans-io, like netio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

REPLY_BYTES_MAX: Final = 64 << 20
_SIMPLE, _ERROR, _INTEGER, _BULK, _ARRAY = b"+-:$*"


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

    def feed(self, data: bytes) -> int:
        self.buffer += data
        if len(self.buffer) > REPLY_BYTES_MAX:
            raise RespError(f"a reply is over {REPLY_BYTES_MAX} bytes")
        count = 0
        position = 0
        while True:
            end = self._skip_reply(position)
            if end < 0:
                break
            count += 1
            position = end
        if position:
            del self.buffer[:position]
        return count

    def _line_end(self, position: int) -> int:
        return self.buffer.find(b"\r\n", position)

    def _skip_reply(self, position: int) -> int:
        """End offset of the reply starting at `position`, or -1 if incomplete."""
        if position >= len(self.buffer):
            return -1
        line_end = self._line_end(position)
        if line_end < 0:
            return -1
        kind = self.buffer[position]
        header = bytes(self.buffer[position + 1 : line_end])
        after_line = line_end + 2
        if kind == _ERROR:
            self.errors_total += 1
            self.errors.append(header.decode("utf-8", "replace"))
            del self.errors[:-16]
        if kind in (_SIMPLE, _INTEGER, _ERROR):
            return after_line
        if kind == _BULK:
            length = int(header)
            end = after_line + length + 2 if length >= 0 else after_line  # -1: nil
            return end if end <= len(self.buffer) else -1
        if kind == _ARRAY:
            items = int(header)
            cursor = after_line
            for _ in range(max(items, 0)):
                cursor = self._skip_reply(cursor)
                if cursor < 0:
                    return -1
            return cursor
        raise RespError(f"not a RESP reply: starts with {bytes([kind])!r}")
