"""The writer's quorum bookkeeping (R3, R4, R6, R9, R10, R11): unit tests per rule and
hypothesis properties over random quorums, answer orders and ensemble changes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.errors import LedgerFenced
from pora.client.replication.core.quorum import (
    AckTracker,
    ensemble_of,
    entry_write_set,
    write_set,
    write_set_positions,
)
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata


def m(i: int) -> EnsembleMember:
    return EnsembleMember(f"n{i}:3181", f"inst-{i}")


def members(n: int, first: int = 0) -> tuple[EnsembleMember, ...]:
    return tuple(m(i) for i in range(first, first + n))


def test_r3_write_sets_stripe_from_position_i_mod_e() -> None:
    assert write_set_positions(0, 5, 3) == (0, 1, 2)
    assert write_set_positions(4, 5, 3) == (4, 0, 1)
    assert write_set_positions(7, 3, 3) == (1, 2, 0)
    assert write_set(3, members(5), 2) == (m(3), m(4))
    with pytest.raises(ValueError):
        write_set_positions(0, 3, 4)


def test_r3_an_entry_belongs_to_the_last_ensemble_starting_at_or_before_it() -> None:
    first, second = Ensemble(0, members(3)), Ensemble(10, (m(0), m(9), m(2)))
    metadata = LedgerMetadata(1, 3, 2, 2, (first, second), b"", 0)
    assert ensemble_of(metadata, 9) == first
    assert ensemble_of(metadata, 10) == second
    assert entry_write_set(metadata, 10) == (m(9), m(2))
    assert entry_write_set(metadata, 9) == (m(0), m(1))


def test_r4_acknowledgements_complete_in_entry_order() -> None:
    tracker = AckTracker(1, 3, 2, Ensemble(0, members(3)))
    for entry_id in range(3):
        tracker.add(entry_id)
    assert tracker.record_ack(1, m(1)) == range(0)
    assert tracker.record_ack(1, m(2)) == range(0)  # entry 1 has its quorum, 0 has not
    assert tracker.record_ack(2, m(2)) == range(0)
    assert tracker.record_ack(2, m(0)) == range(0)
    assert tracker.record_ack(0, m(0)) == range(0)
    assert tracker.record_ack(0, m(1)) == range(3)  # all three at once, in order
    assert tracker.last_add_confirmed == 2
    assert tracker.pending == range(3, 3)


def test_r6_the_same_member_twice_or_a_member_outside_the_write_set_never_counts() -> None:
    tracker = AckTracker(1, 2, 2, Ensemble(0, members(4)))
    assert tracker.add(0) == (m(0), m(1))
    assert tracker.record_ack(0, m(0)) == range(0)
    assert tracker.record_ack(0, m(0)) == range(0)
    assert tracker.record_ack(0, m(2)) == range(0)  # in the ensemble, not the write set
    assert tracker.record_ack(0, EnsembleMember("n1:3181", "wiped")) == range(0)
    assert tracker.record_ack(0, m(1)) == range(1)


def test_r4_a_run_answered_at_once_counts_as_one_ack_per_entry() -> None:
    one_by_one = AckTracker(1, 2, 2, Ensemble(0, members(3)))
    in_bulk = AckTracker(1, 2, 2, Ensemble(0, members(3)))
    for entry_id in range(6):
        one_by_one.add(entry_id)
        in_bulk.add(entry_id)
    for member in members(3):
        mine = [i for i in range(6) if member in one_by_one.write_set(i)]
        for entry_id in mine:
            one_by_one.record_ack(entry_id, member)
        before = in_bulk.last_add_confirmed
        acknowledged = in_bulk.record_acks(member, [*mine, 9])  # 9 was never added
        assert in_bulk.last_add_confirmed == one_by_one.last_add_confirmed
        assert acknowledged == range(before + 1, in_bulk.last_add_confirmed + 1)
    assert in_bulk.last_add_confirmed == 5


def test_r5_entries_are_added_in_order_each_once() -> None:
    tracker = AckTracker(1, 1, 1, Ensemble(0, members(1)))
    tracker.add(0)
    with pytest.raises(ValueError, match="expected 1"):
        tracker.add(0)
    with pytest.raises(ValueError, match="expected 1"):
        tracker.add(2)


def test_r9_r10_a_change_keeps_survivors_acks_and_resends_the_failed_members_entries() -> None:
    tracker = AckTracker(1, 3, 2, Ensemble(0, members(3)))
    for entry_id in range(4):
        tracker.add(entry_id)
    assert tracker.record_ack(0, m(0)) == range(0)
    assert tracker.record_ack(0, m(1)) == range(1)
    tracker.record_ack(1, m(1))  # survivor's ack, kept
    tracker.record_ack(2, m(2))  # the failing member's ack, dropped with it
    assert tracker.record_failure(m(2))
    assert not tracker.record_failure(m(2))  # not news
    change = tracker.change_ensemble({m(2): m(7)})
    assert change.ensemble == Ensemble(1, (m(0), m(1), m(7)))
    assert change.resend == {m(7): (1, 2, 3)}  # every pending entry's write set is all 3
    assert tracker.failed_members == frozenset()
    # R10: survivors answering is not enough while the ensemble is only in memory
    assert tracker.record_ack(1, m(7)) == range(0)
    assert tracker.record_ack(2, m(0)) == range(0)
    assert tracker.record_ack(2, m(7)) == range(0)
    assert tracker.last_add_confirmed == 0
    assert tracker.ensemble_durable(change.ensemble) == range(1, 3)
    # entry 3: the replaced member's late ack does not count
    assert tracker.record_ack(3, m(2)) == range(0)
    assert tracker.record_ack(3, m(0)) == range(0)
    assert tracker.record_ack(3, m(7)) == range(3, 4)


def test_r10_a_superseded_ensemble_becoming_durable_acknowledges_nothing() -> None:
    """Two changes before the first compare-and-set lands: the first ensemble is in
    the metadata, the second (which counts the second replacement's acks) is not."""
    tracker = AckTracker(1, 2, 2, Ensemble(0, members(2)))
    tracker.add(0)
    first = tracker.change_ensemble({m(0): m(5)}).ensemble
    second = tracker.change_ensemble({m(1): m(6)}).ensemble
    assert first.first_entry_id == second.first_entry_id == 0
    tracker.record_ack(0, m(5))
    tracker.record_ack(0, m(6))
    assert tracker.ensemble_durable(first) == range(0)
    assert tracker.ensemble_durable(second) == range(1)


def test_r9_only_current_members_are_replaced_by_new_distinct_nodes() -> None:
    tracker = AckTracker(1, 2, 1, Ensemble(0, members(3)))
    with pytest.raises(ValueError, match="current members"):
        tracker.change_ensemble({m(9): m(8)})
    with pytest.raises(ValueError, match="distinct nodes outside"):
        tracker.change_ensemble({m(0): m(1)})
    with pytest.raises(ValueError, match="distinct nodes outside"):
        tracker.change_ensemble({m(0): m(8), m(1): m(8)})
    assert not tracker.record_failure(m(9))


def test_r11_a_fenced_writer_fails_its_pending_entries_and_acknowledges_nothing_more() -> None:
    tracker = AckTracker(1, 2, 1, Ensemble(0, members(2)))
    for entry_id in range(3):
        tracker.add(entry_id)
    assert tracker.record_ack(0, m(0)) == range(1)
    assert tracker.fence() == range(1, 3)
    assert tracker.pending == range(3, 3)
    with pytest.raises(LedgerFenced):
        tracker.change_ensemble({m(0): m(5)})
    assert tracker.record_ack(1, m(0)) == range(0)
    assert tracker.ensemble_durable(tracker.ensemble) == range(0)
    with pytest.raises(LedgerFenced):
        tracker.add(3)
    assert tracker.last_add_confirmed == 0


def test_a_tracker_resumes_after_a_confirmed_prefix_for_recovery_re_adds() -> None:
    tracker = AckTracker(1, 3, 2, Ensemble(5, members(3)), last_add_confirmed=6)
    assert tracker.add(7) == (m(1), m(2), m(0))
    with pytest.raises(ValueError, match="leaves a gap"):
        AckTracker(1, 3, 2, Ensemble(5, members(3)), last_add_confirmed=2)


# -- properties ------------------------------------------------------------------------


class Model:
    """What really happened, against which the tracker's acknowledgements are judged."""

    def __init__(self, ensemble: Ensemble, write_quorum: int, ack_quorum: int) -> None:
        self.qw, self.qa = write_quorum, ack_quorum
        self.metadata: list[Ensemble] = [ensemble]  # the durable ensembles
        self.unwritten: list[Ensemble] = []  # changes not yet compare-and-set
        self.acked_by: dict[int, set[EnsembleMember]] = {}
        self.lac = -1
        self.fenced = False

    def covering(self, entry_id: int) -> Ensemble:
        return [e for e in self.metadata if e.first_entry_id <= entry_id][-1]

    def check(self, acknowledged: range, tracker: AckTracker) -> None:
        if not acknowledged:
            return
        assert not self.fenced
        # (b) in order, never back
        assert acknowledged.start == self.lac + 1
        assert acknowledged.step == 1
        self.lac = acknowledged.stop - 1
        assert tracker.last_add_confirmed == self.lac
        for entry_id in acknowledged:
            ensemble = self.covering(entry_id)
            # (c) acknowledged only on an ensemble the metadata holds
            assert ensemble == tracker.ensemble or entry_id < tracker.ensemble.first_entry_id
            # (a) Qa distinct members of its write set, as the metadata records it
            holders = set(write_set(entry_id, ensemble.members, self.qw))
            assert len(holders & self.acked_by[entry_id]) >= self.qa

    def make_durable(self, index: int) -> Ensemble:
        """The I/O layer writes changes in the order made; later ones may supersede."""
        ensemble = self.unwritten[index]
        del self.unwritten[: index + 1]
        self.metadata = [e for e in self.metadata if e.first_entry_id < ensemble.first_entry_id]
        self.metadata.append(ensemble)
        return ensemble


@st.composite
def quorums(draw: st.DrawFn) -> tuple[int, int, int]:
    e = draw(st.integers(1, 6))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    return e, qw, qa


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(q=quorums(), data=st.data())
def test_properties_of_acknowledgements_under_random_answers_and_ensemble_changes(
    q: tuple[int, int, int], data: st.DataObject
) -> None:
    """(a) nothing is acknowledged on fewer than Qa members of its write set; (b)
    acknowledgements are in order and the LAC never moves back; (c) nothing at or
    after an ensemble not durable in the metadata is acknowledged; and everything
    pending is acknowledged once every current member answers (nothing stuck)."""
    e, qw, qa = q
    start = Ensemble(0, members(e))
    tracker = AckTracker(1, qw, qa, start)
    model = Model(start, qw, qa)
    fresh = iter(range(100, 10_000))
    seen: list[EnsembleMember] = list(start.members)
    for _ in range(data.draw(st.integers(0, 60))):
        op = data.draw(
            st.sampled_from(
                ["add", "ack", "ack", "ack", "acks", "fail", "change", "durable", "fence"]
            )
        )
        if tracker.fenced:
            break
        if op == "add" and tracker.next_entry_id < 25 and not tracker.fenced:
            entry_id = tracker.next_entry_id
            assert tracker.add(entry_id) == write_set(entry_id, tracker.ensemble.members, qw)
            model.acked_by[entry_id] = set()
        elif op == "ack" and tracker.next_entry_id > 0:
            entry_id = data.draw(st.integers(0, tracker.next_entry_id - 1))
            member = data.draw(st.sampled_from(seen))
            model.acked_by[entry_id].add(member)
            model.check(tracker.record_ack(entry_id, member), tracker)
        elif op == "acks" and tracker.next_entry_id > 0:
            member = data.draw(st.sampled_from(seen))
            entry_ids = data.draw(st.lists(st.integers(0, tracker.next_entry_id - 1)))
            for entry_id in entry_ids:
                model.acked_by[entry_id].add(member)
            model.check(tracker.record_acks(member, entry_ids), tracker)
        elif op == "fail":
            tracker.record_failure(data.draw(st.sampled_from(seen)))
        elif op == "change":
            current = tracker.ensemble.members
            old = data.draw(st.lists(st.sampled_from(current), min_size=1, unique=True))
            replacements = {member: m(next(fresh)) for member in old}
            seen.extend(replacements.values())
            pending = tracker.pending
            change = tracker.change_ensemble(replacements)
            assert change.ensemble.first_entry_id == model.lac + 1
            for entry_id in pending:
                for member in write_set(entry_id, change.ensemble.members, qw):
                    if member in replacements.values():
                        assert entry_id in change.resend[member]
            model.unwritten.append(change.ensemble)
        elif op == "durable" and model.unwritten:
            index = data.draw(st.integers(0, len(model.unwritten) - 1))
            model.check(tracker.ensemble_durable(model.make_durable(index)), tracker)
        elif op == "fence" and data.draw(st.integers(0, 9)) == 0:
            tracker.fence()
            model.fenced = True
    if tracker.fenced:
        return
    # liveness: the last change lands and every current write set answers
    if model.unwritten:
        model.check(tracker.ensemble_durable(model.make_durable(len(model.unwritten) - 1)), tracker)
    for entry_id in tracker.pending:
        for member in tracker.write_set(entry_id):
            model.acked_by[entry_id].add(member)
            model.check(tracker.record_ack(entry_id, member), tracker)
    assert tracker.last_add_confirmed == tracker.next_entry_id - 1
