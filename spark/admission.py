"""Admission control of the streaming source (docs/spark.md, "Streaming reads"):
where a micro-batch ends so that it holds at most so many rows or bytes. Rows are
counted from each entry's header (`entry_rows`, no decoding), bytes are the entries'
payload bytes; a batch always admits its first entry, so a query moves on even when
one entry is over a limit. Pure: the source passes the entries in."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pora import Position
from spark.encoding import entry_rows


@dataclass(frozen=True)
class Limits:
    max_rows: int | None = None
    max_bytes: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.max_rows is None and self.max_bytes is None


def admitted_end(entries: Iterable[tuple[Position, bytes]], limits: Limits) -> Position | None:
    """The position after the last entry admitted (None: there was none)."""
    rows = size = 0
    end: Position | None = None
    for position, payload in entries:
        rows += entry_rows(payload, f"entry {position}")
        size += len(payload)
        over_rows = limits.max_rows is not None and rows > limits.max_rows
        over_bytes = limits.max_bytes is not None and size > limits.max_bytes
        if end is not None and (over_rows or over_bytes):
            break
        end = Position(position.segment, position.entry + 1)
        if over_rows or over_bytes:
            break
    return end
