"""The garbage collector's settings for a long-running hot path (the daemon, `pora bench`).

Python's cyclic collector runs its youngest generation every 700 net allocations of
container objects (tuples, lists, dicts, objects). A node allocates a few per add
and frees almost all of them at once by reference counting, so under load that
default runs hundreds of collections a second, each scanning whatever happened to
be young: a few percent of the event loop (figures: docs/performance.md). A
threshold of 50,000 brings that to a handful per `pora bench` run. The
memory this lets wait is bounded by the threshold: at most that many objects in
cycles are collected later, not leaked.
"""

from __future__ import annotations

import gc
from typing import Final

#: container allocations between collections of the youngest generation (Python: 700)
GC_YOUNG_THRESHOLD_DEFAULT: Final = 50_000


def freeze_and_tune(young_threshold: int) -> None:
    """Move everything allocated so far (modules, long-lived state) out of the
    collector's sight, and collect the youngest generation every `young_threshold`
    allocations; 0 turns the cyclic collector off (reference counting still frees
    everything not in a cycle)."""
    if young_threshold < 0:
        raise ValueError(f"young_threshold must be >= 0, got {young_threshold}")
    # frozen objects are never scanned again: full collections do not pause for
    # the node's long-lived state, which would otherwise show in tail latency
    gc.freeze()
    if young_threshold == 0:
        gc.disable()
        return
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
    gc.enable()
