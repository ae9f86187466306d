"""Where a sequence of adds is cut into frames: the one frame cutter of the client.

Every way the client sends adds cuts them with `cut_frames`: the coalesced adds of
a scheduler turn (`coalescer.frames_for`, per ledger and key, sorted by id), a
writer's batches (`ledger_frames.encode_batches`, in its order) and
`add_entries`' runs (`adds.add_entries`, ADD_RUN frames only). A frame holds at
most RUN_ENTRIES_MAX entries within the frame limit, and its ids rise: by one
each in an ADD_RUN, by any step in an ADD_BATCH.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import islice
from typing import Final

from netio import frames as f

#: What an ADD_BATCH frame costs besides its key and entries, and per entry besides
#: its payload (its id and size); an ADD_RUN (or ADD_ENTRY) costs less, so a cut by
#: these bounds every kind of add frame.
BATCH_FRAME_BASE: Final = f.LENGTH_MIN + f.ADD_BATCH_REQUEST_FIXED.size
BATCH_BYTES_PER_ENTRY: Final = f.BATCH_ITEM.size
#: What an ADD_RUN frame's length field counts besides its key and entries, and what
#: each entry adds besides its payload (its u32 size).
RUN_FRAME_BASE: Final = f.LENGTH_MIN + f.ADD_RUN_REQUEST_FIXED.size
RUN_BYTES_PER_ENTRY: Final = 4
#: the highest entry id a frame carries (the wire's i64)
ID_MAX: Final = 2**63 - 1


def cut_frames(
    ids: Sequence[int],
    sizes: Sequence[int],
    room: int,
    *,
    runs: bool,
    entry_bytes_max: int | None,
) -> list[tuple[int, int]]:
    """`(start, stop)` slices of the entries, in the order given, each one frame.

    A frame ends where the next entry's id does not rise (`runs`: by one), at
    RUN_ENTRIES_MAX entries, or where the next entry would pass `room`, the bytes a
    frame has for its entries. An entry larger than `room` is a frame of its own,
    which the node refuses. With `entry_bytes_max`, an entry the node refuses by
    itself (over that size, or an id outside [0, ID_MAX]) is a frame of its own
    too: in a shared frame its refusal would refuse its neighbours, other callers'
    entries. Without it, such an entry stays in its frame (an `add_entries` run is
    refused whole).
    """
    per_entry = RUN_BYTES_PER_ENTRY if runs else BATCH_BYTES_PER_ENTRY
    run_max = f.RUN_ENTRIES_MAX
    count = len(ids)
    if (
        0 < count <= run_max
        and sum(sizes) + count * per_entry <= room
        and all(map(operator.lt, ids, islice(ids, 1, None)))
        and (not runs or ids[-1] - ids[0] == count - 1)
        and (
            entry_bytes_max is None
            or (ids[0] >= 0 and ids[-1] <= ID_MAX and max(sizes) <= entry_bytes_max)
        )
    ):  # the common case, checked at C speed: all of them are one frame
        return [(0, count)]
    chunks: list[tuple[int, int]] = []
    start = used = 0
    last = -2  # (read only from a frame's second entry on)
    for position, (entry_id, size) in enumerate(zip(ids, sizes, strict=True)):
        cost = per_entry + size
        alone = entry_bytes_max is not None and not (
            0 <= entry_id <= ID_MAX and size <= entry_bytes_max
        )
        if position > start and (
            alone
            or (entry_id != last + 1 if runs else entry_id <= last)
            or position - start == run_max
            or used + cost > room
        ):
            chunks.append((start, position))
            start, used = position, 0
        if alone:
            chunks.append((position, position + 1))
            start, used, last = position + 1, 0, -2
            continue
        used += cost
        last = entry_id
    if start < count:
        chunks.append((start, count))
    return chunks


__all__ = [
    "BATCH_BYTES_PER_ENTRY",
    "BATCH_FRAME_BASE",
    "ID_MAX",
    "RUN_BYTES_PER_ENTRY",
    "RUN_FRAME_BASE",
    "cut_frames",
]
