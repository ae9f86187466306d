"""The client's one frame cutter: what every way of sending adds relies on."""

from __future__ import annotations

from netio.frames import RUN_ENTRIES_MAX
from pora.client.frame_cuts import (
    BATCH_BYTES_PER_ENTRY,
    ID_MAX,
    RUN_BYTES_PER_ENTRY,
    cut_frames,
)

ROOMY = 1 << 30


def test_rising_ids_that_fit_are_one_frame_of_either_kind() -> None:
    ids = [3, 4, 5, 6]
    assert cut_frames(ids, [10] * 4, ROOMY, runs=True, entry_bytes_max=None) == [(0, 4)]
    strided = [0, 3, 6, 9]
    assert cut_frames(strided, [10] * 4, ROOMY, runs=False, entry_bytes_max=100) == [(0, 4)]
    assert cut_frames([], [], ROOMY, runs=True, entry_bytes_max=None) == []


def test_a_run_ends_where_ids_stop_going_up_by_one_a_batch_where_they_stop_rising() -> None:
    ids = [0, 1, 2, 5, 6, 4, 4, 9]
    sizes = [1] * len(ids)
    assert cut_frames(ids, sizes, ROOMY, runs=True, entry_bytes_max=None) == [
        (0, 3),
        (3, 5),
        (5, 6),
        (6, 7),
        (7, 8),
    ]
    assert cut_frames(ids, sizes, ROOMY, runs=False, entry_bytes_max=None) == [
        (0, 5),
        (5, 6),  # 4 after 6: not rising
        (6, 8),  # 4 after 4 (a retry beside its original): never in one frame
    ]


def test_frames_hold_at_most_run_entries_max_entries_and_their_room() -> None:
    count = RUN_ENTRIES_MAX * 2 + 1
    ids = list(range(count))
    cuts = cut_frames(ids, [0] * count, ROOMY, runs=True, entry_bytes_max=None)
    assert cuts == [(0, 1024), (1024, 2048), (2048, 2049)]
    room = 3 * (RUN_BYTES_PER_ENTRY + 100)  # three entries of 100 bytes a frame
    cuts = cut_frames(list(range(7)), [100] * 7, room, runs=True, entry_bytes_max=None)
    assert cuts == [(0, 3), (3, 6), (6, 7)]
    room = 2 * (BATCH_BYTES_PER_ENTRY + 100)  # a batch's entries cost more
    cuts = cut_frames([0, 2, 4, 6], [100] * 4, room, runs=False, entry_bytes_max=1000)
    assert cuts == [(0, 2), (2, 4)]


def test_an_entry_the_node_refuses_alone_goes_alone_only_when_asked() -> None:
    ids = [0, 1, 2, 3, 4]
    sizes = [10, 10, 5000, 10, 10]  # entry 2 is over the node's entry_bytes_max
    assert cut_frames(ids, sizes, ROOMY, runs=False, entry_bytes_max=1000) == [
        (0, 2),
        (2, 3),
        (3, 5),
    ]
    # add_entries: the run carries it, and the node refuses the whole run
    assert cut_frames(ids, sizes, ROOMY, runs=True, entry_bytes_max=None) == [(0, 5)]
    # ids outside the wire's range, too
    bad = [-1, 0, 1, ID_MAX + 1]
    assert cut_frames(bad, [1] * 4, ROOMY, runs=False, entry_bytes_max=1000) == [
        (0, 1),
        (1, 3),
        (3, 4),
    ]


def test_an_entry_larger_than_any_frame_is_a_frame_of_its_own() -> None:
    room = 1000
    cuts = cut_frames([0, 1, 2], [10, 5000, 10], room, runs=True, entry_bytes_max=None)
    assert cuts == [(0, 1), (1, 2), (2, 3)]
