"""A writer's pending adds as a pure state machine (`core/pending_adds.py`), driven
with plain calls and no event loop: striping (R3), acknowledgements (R4), the LAC
flush (R7), failures and replacements (R8..R10) and the fence (R11, R13)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import LedgerFenced
from pora.client.replication.core.entry_format import HEADER_BYTES, decode_entry
from pora.client.replication.core.pending_adds import PendingAdds, Send
from pora.client.replication.core.quorum import write_set
from pora.meta.records import Ensemble, EnsembleMember

TOKEN = 77


def m(i: int) -> EnsembleMember:
    return EnsembleMember(f"n{i}:3181", f"inst-{i}")


def machine(
    size: int, write_quorum: int, ack_quorum: int, *, call_bytes_max: int = 1 << 20
) -> PendingAdds:
    ensemble = Ensemble(0, tuple(m(i) for i in range(size)))
    return PendingAdds(5, TOKEN, write_quorum, ack_quorum, ensemble, call_bytes_max=call_bytes_max)


def by_member(sends: list[Send]) -> dict[EnsembleMember, list[int]]:
    """The ids each member is sent, over every send of a turn."""
    ids: dict[EnsembleMember, list[int]] = {}
    for member, entries, _ in sends:
        ids.setdefault(member, []).extend(entry_id for entry_id, _ in entries)
    return ids


def answer_all(adds: PendingAdds, sends: list[Send]) -> list[int]:
    """Every member answers every batch OK; the ids acknowledged, in order."""
    acked: list[int] = []
    for member, entries, _ in sends:
        acked += adds.acked(member, entries, -1).ids
    return acked


@settings(max_examples=60, deadline=None)
@given(
    quorums=st.integers(1, 6).flatmap(
        lambda e: st.tuples(st.just(e), st.integers(1, e)).flatmap(
            lambda eq: st.tuples(st.just(eq[0]), st.just(eq[1]), st.integers(1, eq[1]))
        )
    ),
    count=st.integers(1, 40),
)
def test_r3_each_member_is_sent_exactly_its_write_sets(
    quorums: tuple[int, int, int], count: int
) -> None:
    size, write_quorum, ack_quorum = quorums
    adds = machine(size, write_quorum, ack_quorum)
    for k in range(count):
        assert adds.add(b"p%d" % k) == k
    sends = adds.take_batches()
    members = adds.ensemble.members
    expected: dict[EnsembleMember, list[int]] = {}
    for entry_id in range(count):
        for member in write_set(entry_id, members, write_quorum):
            expected.setdefault(member, []).append(entry_id)
    assert by_member(sends) == expected
    for _, entries, payload_bytes in sends:  # the entries as encoded, the bytes counted
        assert payload_bytes == sum(len(entry) - HEADER_BYTES for _, entry in entries)
        for entry_id, entry in entries:
            decoded = decode_entry(5, entry_id, entry, token=TOKEN)
            assert decoded.payload == b"p%d" % entry_id
    assert adds.take_batches() == []  # a turn takes each entry once
    assert answer_all(adds, sends) == list(range(count))
    assert adds.pending == range(count, count)


def test_r4_an_entry_needs_qa_distinct_members_and_duplicates_count_once() -> None:
    adds = machine(3, 3, 2)
    adds.add(b"a")
    (first, entries, _), (second, _, _), _ = adds.take_batches()
    assert adds.acked(first, entries, -1).ids == range(0)
    assert adds.acked(first, entries, -1).ids == range(0)  # the same member again
    released = adds.acked(second, entries, -1)
    assert released.ids == range(1)
    assert released.payload_bytes == 1
    assert adds.last_add_confirmed == 0
    assert adds.acked_length == 1


def test_r4_the_lac_advances_only_over_a_contiguous_run() -> None:
    adds = machine(1, 1, 1)
    for payload in (b"a", b"bb", b"ccc"):
        adds.add(payload)
    ((member, entries, _),) = adds.take_batches()
    assert adds.acked(member, entries[2:], -1).ids == range(0)  # 2 waits for 0 and 1
    assert adds.acked(member, entries[1:2], -1).ids == range(0)
    assert adds.last_add_confirmed == -1
    released = adds.acked(member, entries[:1], -1)
    assert released.ids == range(3)
    assert released.payload_bytes == 6
    assert adds.acked_length == 6


def test_an_ack_outside_an_entrys_write_set_counts_nothing() -> None:
    adds = machine(3, 2, 2)
    adds.add(b"x")  # entry 0: positions 0 and 1
    adds.take_batches()
    stray = [(0, b"forged")]
    assert adds.acked(m(2), stray, -1).ids == range(0)
    assert adds.acked(m(9), stray, -1).ids == range(0)  # not a member at all
    assert adds.acked(m(0), stray, -1).ids == range(0)
    assert adds.acked(m(1), stray, -1).ids == range(1)


def test_the_entries_of_one_turn_go_out_together_and_later_ones_in_the_next() -> None:
    adds = machine(2, 2, 1)
    assert adds.add(b"a") == adds.first_untaken == 0
    assert adds.add(b"b") == 1
    assert adds.first_untaken == 0
    assert by_member(adds.take_batches()) == {m(0): [0, 1], m(1): [0, 1]}
    assert adds.first_untaken == 2
    assert adds.add(b"c") == adds.first_untaken == 2


def test_a_turn_is_cut_to_the_call_bytes_bound_but_never_splits_an_entry() -> None:
    adds = machine(1, 1, 1, call_bytes_max=10)
    for payload in (b"1234", b"5678", b"90", b"x" * 25, b"y"):
        adds.add(payload)
    sends = adds.take_batches()
    assert [[i for i, _ in entries] for _, entries, _ in sends] == [[0, 1, 2], [3], [4]]
    assert [size for _, _, size in sends] == [10, 25, 1]


def test_r8_a_failed_member_is_sent_nothing_and_reported_once() -> None:
    adds = machine(3, 3, 2)
    assert adds.failed(m(1)) is True
    assert adds.failed(m(1)) is False  # no news
    assert adds.failed(m(7)) is False  # not a member
    adds.add(b"a")
    assert set(by_member(adds.take_batches())) == {m(0), m(2)}
    assert adds.failed_members == {m(1)}


def test_r10_a_replacement_is_sent_the_pending_entries_of_its_write_sets() -> None:
    adds = machine(3, 2, 2)
    for k in range(4):
        adds.add(b"%d" % k)
    sent = adds.take_batches()
    # entry 0 (positions 0, 1) is acknowledged before the failure
    assert adds.acked(m(0), [(0, b"")], -1).ids == range(0)
    assert adds.acked(m(1), [(0, b"")], -1).ids == range(1)
    adds.add(b"4")  # not taken yet when the change comes: goes with its turn
    assert adds.failed(m(1))
    change = adds.replace({m(1): m(9)})
    assert change.ensemble == Ensemble(1, (m(0), m(9), m(2)))
    # position 1 holds 0, 1, 3 and 4: 0 is acknowledged, 4 was not taken yet
    assert change.resend == {m(9): (1, 3, 4)}
    sends = adds.take_batches()
    resend, *turn = sends
    assert resend.member == m(9)
    assert [i for i, _ in resend.entries] == [1, 3]
    assert by_member(turn) == {m(9): [4], m(2): [4]}  # entry 4 with its turn
    # the member replaced: its late answers count nothing, and it is sent nothing
    assert not adds.sends_to(m(1))
    assert adds.sends_to(m(9))
    old_batches = [send for send in sent if send.member == m(1)]
    assert adds.acked(m(1), old_batches[0].entries, -1).ids == range(0)
    # R10: nothing from the new ensemble's first entry on before it is durable
    answer_all(adds, [s for s in sent if s.member != m(1)])
    assert adds.acked(m(9), resend.entries, -1).ids == range(0)
    assert adds.last_add_confirmed == 0
    released = adds.ensemble_durable(change.ensemble)
    assert released.ids == range(1, 4)
    assert released.payload_bytes == 3
    assert adds.ensemble_durable(change.ensemble).ids == range(0)


def test_a_member_replaced_by_itself_is_sent_its_entries_again() -> None:
    adds = machine(2, 2, 2)
    adds.add(b"a")
    adds.take_batches()
    adds.failed(m(0))
    change = adds.replace({m(0): m(0)})
    assert change.resend == {m(0): (0,)}
    assert by_member(adds.take_batches()) == {m(0): [0]}


def test_a_fence_fails_every_pending_entry_and_ends_the_machine() -> None:
    adds = machine(3, 3, 2)
    for payload in (b"a", b"bb", b"ccc"):
        adds.add(payload)
    sends = adds.take_batches()
    adds.acked(sends[0].member, sends[0].entries[:1], -1)
    adds.acked(sends[1].member, sends[1].entries[:1], -1)  # entry 0 acknowledged
    adds.add(b"dddd")  # untaken
    failed = adds.fence()
    assert failed.ids == range(1, 4)
    assert failed.payload_bytes == 2 + 3 + 4
    assert adds.fenced
    assert adds.take_batches() == []
    assert not adds.sends_to(m(0))
    assert adds.acked(sends[2].member, sends[2].entries, -1).ids == range(0)
    assert adds.last_add_confirmed == 0
    with pytest.raises(LedgerFenced):
        adds.add(b"late")
    assert adds.lac_to_flush() is None


def test_r7_the_lac_is_flushed_once_and_only_when_no_add_carried_it() -> None:
    adds = machine(1, 1, 1)
    assert adds.lac_to_flush() is None  # nothing acknowledged
    adds.add(b"a")
    ((member, entries, _),) = adds.take_batches()
    adds.acked(member, entries, -1)
    assert adds.answers == 1
    assert adds.lac_to_flush() == 0
    assert adds.lac_to_flush() is None  # sent already
    adds.add(b"b")
    adds.add(b"c")
    ((member, entries, _),) = adds.take_batches()
    adds.acked(member, entries[:1], 0)
    adds.answered(1)  # a call carrying LAC 1 answered, refusing an entry
    assert adds.answers == 3
    assert adds.lac_sent == 1
    assert adds.lac_to_flush() is None


def test_the_ledger_length_is_bounded_by_the_entries_length_field() -> None:
    adds = machine(1, 1, 1)
    adds._length = (1 << 64) - 2  # as if that much was written
    adds.add(b"x")
    with pytest.raises(ValueError, match="64-bit length"):
        adds.add(b"y")
    assert adds.next_entry_id == 1  # the refused payload took no id


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="call_bytes_max"):
        machine(1, 1, 1, call_bytes_max=0)
    with pytest.raises(ValueError, match="E >= Qw >= Qa"):
        machine(2, 3, 1)


@settings(max_examples=80, deadline=None)
@given(
    quorums=st.sampled_from([(1, 1, 1), (2, 2, 1), (3, 2, 2), (3, 3, 2), (5, 3, 2), (4, 2, 1)]),
    steps=st.lists(st.tuples(st.sampled_from(["add", "take", "answer"]), st.integers(0, 99))),
)
def test_answers_in_any_order_release_each_entry_once_in_order_after_qa_acks(
    quorums: tuple[int, int, int], steps: list[tuple[str, int]]
) -> None:
    """Whatever interleaves adds, turns and answers (in any order, some twice),
    every released range starts where the last ended, each entry is released once,
    only after Qa distinct members of its write set stored it, with its bytes."""
    size, write_quorum, ack_quorum = quorums
    adds = machine(size, write_quorum, ack_quorum)
    unanswered: list[Send] = []
    stored: dict[int, set[EnsembleMember]] = {}
    sizes: list[int] = []
    released_to = 0
    for action, pick in steps:
        if action == "add":
            sizes.append(pick % 7)
            adds.add(b"x" * sizes[-1])
        elif action == "take":
            unanswered += adds.take_batches()
        elif unanswered:
            send = unanswered[pick % len(unanswered)]
            if pick % 3:  # answered once; else it may come again (a duplicate)
                unanswered.remove(send)
            for entry_id, _ in send.entries:
                stored.setdefault(entry_id, set()).add(send.member)
            released = adds.acked(send.member, send.entries, -1)
            assert released.ids.start == released_to or not released.ids
            for entry_id in released.ids:
                holders = set(write_set(entry_id, adds.ensemble.members, write_quorum))
                assert len(stored[entry_id] & holders) >= ack_quorum
            assert released.payload_bytes == sum(sizes[i] for i in released.ids)
            released_to = released.ids.stop if released.ids else released_to
    assert adds.last_add_confirmed == released_to - 1
    assert adds.acked_length == sum(sizes[:released_to])
    assert adds.pending == range(released_to, adds.next_entry_id)
