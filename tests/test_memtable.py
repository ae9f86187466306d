"""The memtable's order bookkeeping: a flush skips its sort only when that is safe."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from journal.format import encode_body
from ledger.memtable import MemoryBudget, Memtable

# each step: ("put", entry id) or ("run", first id, length)
_STEP = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 60)),
    st.tuples(st.just("run"), st.integers(0, 60), st.integers(1, 8)),
)


@given(st.lists(_STEP, max_size=40), st.lists(_STEP, max_size=20))
def test_a_flush_said_in_order_iterates_in_entry_id_order(
    before: list[tuple[str, int] | tuple[str, int, int]],
    after: list[tuple[str, int] | tuple[str, int, int]],
) -> None:
    budget = MemoryBudget(1 << 30)
    memtable = Memtable(budget, recent_bytes_max=1 << 20)

    def apply(steps: list[tuple[str, int] | tuple[str, int, int]]) -> int:
        added = 0
        for step in steps:
            if step[0] == "put":
                memtable.put(step[1], encode_body(1, step[1], -1, b"x"))
                added += 1
            else:
                first, length = step[1], step[2]  # type: ignore[misc]
                # a run holds new entries only (the worker's fast path guarantees it)
                ids = [i for i in range(first, first + length) if i not in memtable.unflushed]
                memtable.put_many(ids, [encode_body(1, i, -1, b"y") for i in ids])
                added += len(ids)
        return added

    apply(before)
    flushing = memtable.begin_flush()
    ids = list(flushing)
    if memtable.flushing_in_order:
        assert ids == sorted(ids)
    # appends past everything seen start a new, ordered generation
    apply(after)
    if memtable.unflushed_in_order:
        assert list(memtable.unflushed) == sorted(memtable.unflushed)
    flushed_bytes = sum(len(body) for body in flushing.values())
    assert memtable.resident_bytes == memtable.unflushed_bytes + flushed_bytes
    memtable.end_flush()
    assert memtable.resident_bytes == memtable.unflushed_bytes + min(flushed_bytes, 1 << 20)


def test_an_out_of_order_put_makes_the_flush_sort() -> None:
    memtable = Memtable(MemoryBudget(1 << 30), recent_bytes_max=1 << 20)
    memtable.put_many(range(5, 8), [encode_body(1, i, -1, b"a") for i in range(5, 8)])
    memtable.put(3, encode_body(1, 3, -1, b"b"))
    memtable.begin_flush()
    assert memtable.flushing_in_order is False
    memtable.end_flush()
    memtable.put(1, encode_body(1, 1, -1, b"c"))  # a new generation: in order again
    memtable.put(2, encode_body(1, 2, -1, b"d"))
    memtable.begin_flush()
    assert memtable.flushing_in_order is True


def test_replayed_views_are_served_until_flushed_and_never_kept_as_recent() -> None:
    """Replay hands bodies as views of a journal segment: the memtable serves them
    while unflushed or flushing (also after a failed flush), but keeps none as
    recent, which would pin the segment's mapping (and its disk space, or bytes a
    recycled segment rewrites) past the journal's trim."""
    memtable = Memtable(MemoryBudget(1 << 30), recent_bytes_max=1 << 20)
    segment = bytearray(b"".join(encode_body(1, i, -1, b"p%d" % i) for i in range(3)))
    length = len(segment) // 3
    views = [memoryview(segment)[i * length : (i + 1) * length] for i in range(3)]
    memtable.replaying()
    memtable.put_many(range(2), views[:2])
    memtable.put(2, views[2])
    memtable.begin_flush()
    assert [memtable.get(i) for i in range(3)] == [b"p0", b"p1", b"p2"]
    memtable.abort_flush()  # a failed flush: still views, still served
    assert memtable.items_between(0, 2) == {0: b"p0", 1: b"p1", 2: b"p2"}
    memtable.begin_flush()
    memtable.end_flush()
    assert memtable.get(0) is None and memtable.resident_bytes == 0
    # bodies the requests made (bytes) are kept as recent as before
    memtable.put(3, encode_body(1, 3, -1, b"q"))
    memtable.begin_flush()
    memtable.end_flush()
    assert memtable.get(3) == b"q"
