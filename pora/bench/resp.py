"""A minimal RESP2 encoder and incremental reply counter, for the Redis benchmark.

Only what a pipelined `XADD` load needs: encode a command once, then count
replies as bytes arrive (simple strings, errors, integers, bulk strings, and
arrays of those), keeping incomplete ones buffered. Sans-io, like netio.

Speed: XADD replies are bulk strings of the new entry's id (`<ms>-<seq>`); a run
of them is matched and counted in C (one regular expression match and a count),
not reply by reply. Anything else goes through the general parser.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

REPLY_BYTES_MAX: Final = 64 << 20
_SIMPLE, _ERROR, _INTEGER, _BULK, _ARRAY = b"+-:$*"


def _id_run_pattern() -> re.Pattern[bytes]:
    """Bulk strings `$n\\r\\n<ms>-<seq>\\r\\n` (XADD's replies), one or more in a
    row, each n its id's length: for each n from 3 to 41 (two u64s in decimal and a
    dash), a lookahead checks that exactly n id bytes come before the CR. Lengths
    are grouped by their first digit, which keeps the match fast."""
    one_length = rb"%d\r\n(?=[0-9-]{%d}\r)"
    alternatives = [one_length % (n, n) for n in range(3, 10)]
    for tens in range(1, 5):
        same_tens = [one_length % (n % 10, n) for n in range(tens * 10, min(tens * 10 + 10, 42))]
        alternatives.append(b"%d(?:%s)" % (tens, b"|".join(same_tens)))
    return re.compile(rb"(?:\$(?:%s)[0-9]+-[0-9]+\r\n)+" % b"|".join(alternatives))


_ID_RUN: Final = _id_run_pattern()


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
            run, position = self._skip_id_run(position)
            count += run
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

    def _skip_id_run(self, position: int) -> tuple[int, int]:
        """(replies, end offset) of the run of complete XADD id replies starting at
        `position`; (0, position) if there is none there.

        One regular expression match (in C) spans the run and a count of `$` in it
        counts it, the ids themselves holding none. Exactly the replies the general
        parser would count there: each is checked to be `$n\\r\\n`, then n id
        bytes, then `\\r\\n`.
        """
        match = _ID_RUN.match(self.buffer, position)
        if match is None:
            return 0, position
        end = match.end()
        return self.buffer.count(b"$", position, end), end

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
