"""Which segments a truncation or a trim removes: pure decisions, no I/O
(docs/streams.md, "Retention"). `stream.py` reads the document, its pages and its
cursors, asks these, and compare-and-sets `document.truncate`.

Only whole CLOSED segments are removed, oldest first; the OPEN segment never is.
"""

from __future__ import annotations

from collections.abc import Sequence

from pora.streams.document import Segment, SegmentState, StreamConfig
from pora.streams.position import Position

#: a position after every segment: `wholly_before` it counts the CLOSED ones
_LAST = Position(2**63 - 1, 0)


def wholly_before(held: Sequence[Segment], before: Position) -> int:
    """How many of the leading held segments lie wholly before `before` (every entry
    of theirs is at a smaller position), stopping at the first OPEN one."""
    count = 0
    for segment in held:
        if segment.state is not SegmentState.CLOSED:
            break
        if segment.seq < before.segment or (
            segment.seq == before.segment and segment.last_entry_id < before.entry
        ):
            count += 1
        else:
            break
    return count


def needed_from(held: Sequence[Segment], cursor_next: Position) -> int:
    """The index in `held` of the first segment a cursor that reads next from
    `cursor_next` still needs (len(held) when it needs none of them)."""
    return wholly_before(held, cursor_next)


def _over_limits(
    held: Sequence[Segment], now_ms: int, age_s: float | None, size: int | None
) -> int:
    """How many leading CLOSED segments are past the age limit or make the stream
    hold more than `size` bytes: age by close time (unknown close time: never by
    age); size counting the CLOSED segments' payload bytes."""
    closed = held[: wholly_before(held, _LAST)]
    total = sum(s.byte_length for s in closed)
    count = 0
    for segment in closed:
        too_old = (
            age_s is not None
            and segment.closed_ms > 0
            and now_ms - segment.closed_ms >= age_s * 1000
        )
        too_big = size is not None and total > size
        if not (too_old or too_big):
            break
        total -= segment.byte_length
        count += 1
    return count


def trim_count(
    held: Sequence[Segment],
    config: StreamConfig,
    now_ms: int,
    cursor_nexts: Sequence[Position],
) -> int:
    """How many leading held segments `trim` removes: those past `retention_s` or
    `retention_bytes` up to the first a cursor still needs, and beyond that those
    past the hard limits (`retention_s_max`, `retention_bytes_max`) whatever the
    cursors need. Never the OPEN segment."""
    soft = _over_limits(held, now_ms, config.retention_s, config.retention_bytes)
    for position in cursor_nexts:
        soft = min(soft, needed_from(held, position))
    hard = _over_limits(held, now_ms, config.retention_s_max, config.retention_bytes_max)
    return max(soft, hard)
