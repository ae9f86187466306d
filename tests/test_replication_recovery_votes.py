"""A recovery's bookkeeping: fencing coverage (R17), the start point (R18) and each
entry's vote (R19), with the BookKeeper lessons each one answers."""

from __future__ import annotations

import pytest
from depth import two_depths
from hypothesis import given, settings
from hypothesis import strategies as st

from pora.client.replication.core.entry_format import encode_entry
from pora.client.replication.core.ledger_records import (
    in_recovery,
    new_ledger,
    recovery_ensemble,
    with_ensemble_change,
)
from pora.client.replication.core.quorum import AckTracker, write_set, write_set_positions
from pora.client.replication.core.recovery_votes import (
    EntryRecoveryVote,
    FenceCoverage,
    VoteOutcome,
    absence_quorum,
    recovery_start,
    recovery_vote,
)
from pora.meta.records import Ensemble, EnsembleMember


def m(i: int) -> EnsembleMember:
    return EnsembleMember(f"n{i}:3181", f"inst-{i}")


def members(n: int) -> tuple[EnsembleMember, ...]:
    return tuple(m(i) for i in range(n))


def vote(write_quorum: int = 3, ack_quorum: int = 2) -> EntryRecoveryVote:
    return EntryRecoveryVote(4, 7, members(write_quorum), ack_quorum)


def outcome_of(v: EntryRecoveryVote) -> VoteOutcome:
    """The outcome as a plain value (mypy narrows a property across assertions)."""
    return v.outcome


def test_r17_coverage_needs_qw_minus_qa_plus_1_fenced_in_every_write_set() -> None:
    coverage = FenceCoverage(Ensemble(0, members(5)), 3, 2)
    assert coverage.needed == 2
    assert not coverage.record_fenced("n0:3181")
    assert not coverage.record_fenced("n2:3181")
    # write set {1,2,3} has one fenced member; {3,4,0} too
    assert (m(1), m(2), m(3)) in coverage.uncovered_write_sets()
    assert not coverage.record_fenced("n9:3181")  # not a member
    assert coverage.record_fenced("n3:3181") is False  # {4,0,1} still has only n0
    assert coverage.record_fenced("n4:3181")
    assert coverage.fenced == {"n0:3181", "n2:3181", "n3:3181", "n4:3181"}


def test_r17_with_e_equal_qw_equal_qa_one_fenced_node_covers() -> None:
    coverage = FenceCoverage(Ensemble(0, members(3)), 3, 3)
    assert coverage.record_fenced("n1:3181")


@two_depths(full=300)
def test_r17_property_coverage_iff_no_write_set_has_qa_unfenced_members(examples: int) -> None:
    """(e) coverage implies no write set has Qa unfenced members, and the converse."""

    @settings(max_examples=examples)
    @given(
        e=st.integers(1, 7),
        data=st.data(),
    )
    def check(e: int, data: st.DataObject) -> None:
        qw = data.draw(st.integers(1, e))
        qa = data.draw(st.integers(1, qw))
        fenced = data.draw(st.sets(st.integers(0, e - 1)))
        coverage = FenceCoverage(Ensemble(0, members(e)), qw, qa)
        for position in fenced:
            coverage.record_fenced(m(position).address)
        some_write_set_can_ack = any(
            len(set(write_set_positions(start, e, qw)) - fenced) >= qa for start in range(e)
        )
        assert coverage.covered is not some_write_set_can_ack

    check()


def test_r18_recovery_starts_after_the_highest_lac_reported() -> None:
    assert recovery_start([3, 7, 5], Ensemble(0, members(3))) == 8
    assert recovery_start([], Ensemble(0, members(3))) == 0


def test_r18_a_just_added_ensemble_is_read_from_its_first_entry_not_from_0() -> None:
    """BookKeeper #2615: the new ensemble's members report LAC -1; entries before its
    first were acknowledged before the change and must not be re-read as absent."""
    assert recovery_start([-1, -1, -1], Ensemble(40, members(3))) == 40
    assert recovery_start([-1, 45], Ensemble(40, members(3))) == 46


def test_r18_an_ensemble_a_recovery_wrote_is_read_from_its_first_entry() -> None:
    """Its joined member holds only what that recovery re-added: every entry from the
    ensemble's first on is re-added again, whatever LAC the writer's members report."""
    replaced = recovery_ensemble(Ensemble(0, members(3)), 5, {m(0): m(9)})
    assert recovery_start([40, 12], replaced) == 5
    assert recovery_start([40, 12], Ensemble(5, members(3))) == 41


def test_r19_present_from_any_member_with_a_valid_crc() -> None:
    v = vote()
    v.record_no_such_entry("n0:3181", "inst-0")
    assert outcome_of(v) is VoteOutcome.WAITING
    v.record_entry("n1:3181", "inst-1", encode_entry(4, 7, 10, b"payload"))
    assert outcome_of(v) is VoteOutcome.PRESENT
    assert v.entry is not None
    assert (v.entry.payload, v.entry.length_after) == (b"payload", 10)


def test_r19_absent_at_qw_minus_qa_plus_1_negatives_so_one_hung_node_cannot_stall() -> None:
    """BookKeeper #1067: the third member never answers."""
    v = vote()
    v.record_no_such_entry("n0:3181", "inst-0")
    v.record_no_such_entry("n0:3181", "inst-0")  # the same member twice counts once
    assert outcome_of(v) is VoteOutcome.WAITING
    v.record_no_such_entry("n2:3181", "inst-2")
    assert outcome_of(v) is VoteOutcome.ABSENT
    assert v.members_to_ask() == (m(1),)


def test_r19_errors_and_corrupt_answers_are_never_absence() -> None:
    """BookKeeper #2908: a node that cannot read an entry must not cut the ledger."""
    v = vote()
    v.record_no_such_entry("n0:3181", "inst-0")
    v.record_error("n1:3181", "CORRUPT: index entry fails its checksum")
    v.record_error("n2:3181", "timed out")
    assert outcome_of(v) is VoteOutcome.UNKNOWN
    assert v.undecided == {
        "n1:3181": "CORRUPT: index entry fails its checksum",
        "n2:3181": "timed out",
    }
    assert v.ask_again() == (m(1), m(2))
    assert outcome_of(v) is VoteOutcome.WAITING
    v.record_entry("n2:3181", "inst-2", encode_entry(4, 7, 1, b"x"))
    assert outcome_of(v) is VoteOutcome.PRESENT


def test_r19_a_crc_failure_is_unknown_and_reported() -> None:
    v = vote(write_quorum=2, ack_quorum=1)
    damaged = bytearray(encode_entry(4, 7, 3, b"abc"))
    damaged[-1] ^= 0xFF
    v.record_entry("n0:3181", "inst-0", bytes(damaged))
    v.record_entry("n1:3181", "inst-1", encode_entry(4, 8, 3, b"abc"))  # another entry's
    assert outcome_of(v) is VoteOutcome.UNKNOWN
    assert [address for address, _ in v.damaged] == ["n0:3181", "n1:3181"]


def test_r19_a_wiped_node_answering_no_such_entry_is_unknown_not_absent() -> None:
    """BookKeeper #2612: same address, new data dir: it never held what the old one did."""
    v = vote()
    v.record_no_such_entry("n0:3181", "inst-0")
    v.record_no_such_entry("n1:3181", "fresh-instance")
    v.record_no_such_entry("n9:3181", "inst-9")  # not in the write set
    assert outcome_of(v) is VoteOutcome.WAITING
    assert "data dir replaced" in v.undecided["n1:3181"]
    v.record_entry("n1:3181", "fresh-instance", encode_entry(4, 7, 1, b"x"))
    assert v.entry is None


def test_r19_a_member_that_joined_in_a_recovery_proves_presence_never_absence() -> None:
    """A record where a recovery replaced n0 by n9 (E = Qw = Qa = 3): the writer's
    members decide; n9 is asked too, and only its copy counts."""
    writers = Ensemble(0, members(3))
    record = new_ledger(4, 3, 3, writers.members, b"k" * 32, 0)
    record = with_ensemble_change(in_recovery(record), recovery_ensemble(writers, 0, {m(0): m(9)}))
    v = recovery_vote(record, 7)
    assert set(v.write_set) == set(members(3))
    assert v.joined == (m(9),)
    v.record_no_such_entry("n9:3181", "inst-9")
    assert outcome_of(v) is VoteOutcome.WAITING
    assert m(9) not in v.members_to_ask()
    v.record_no_such_entry("n1:3181", "inst-1")
    assert outcome_of(v) is VoteOutcome.ABSENT
    present = recovery_vote(record, 7)
    present.record_entry("n9:3181", "inst-9", encode_entry(4, 7, 1, b"x"))
    assert outcome_of(present) is VoteOutcome.PRESENT


def test_absence_quorum_bounds() -> None:
    assert absence_quorum(3, 2) == 2
    assert absence_quorum(5, 5) == 1
    with pytest.raises(ValueError):
        absence_quorum(2, 3)


ANSWERS = ["entry", "no_such_entry", "error", "wiped", "damaged", "silent"]


@two_depths(full=400)
def test_r19_property_an_absent_vote_never_has_qa_holders(examples: int) -> None:
    """(d) an entry voted absent cannot have Qa members of its write set holding it:
    with fencing nodes, a holder answers the entry, an error, or nothing; a node that
    does not hold it answers no such entry, an error, or nothing; a wiped holder
    answers from a new instance."""

    @settings(max_examples=examples)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        qw = data.draw(st.integers(1, 6))
        qa = data.draw(st.integers(1, qw))
        entry_id = data.draw(st.integers(0, 100))
        ensemble = members(qw + 2)
        ws = write_set(entry_id, ensemble, qw)
        v = EntryRecoveryVote(4, entry_id, ws, qa)
        holds = {member: data.draw(st.booleans()) for member in ws}
        bytes_ = encode_entry(4, entry_id, 5, b"hello")
        for member in data.draw(st.permutations(list(ws) * 2)):
            answer = data.draw(st.sampled_from(ANSWERS))
            if answer == "silent":
                continue
            if answer == "wiped":
                v.record_no_such_entry(member.address, "new-" + member.instance_id)
            elif answer == "error":
                v.record_error(member.address, "error")
            elif answer == "damaged":
                v.record_entry(member.address, member.instance_id, bytes_[:-1] + b"?")
            elif holds[member]:
                v.record_entry(member.address, member.instance_id, bytes_)
            else:
                v.record_no_such_entry(member.address, member.instance_id)
            if v.outcome is VoteOutcome.ABSENT:
                assert sum(holds.values()) < qa
                assert len(v.negatives) >= qw - qa + 1
            if v.outcome is VoteOutcome.PRESENT:
                assert v.entry is not None
                assert v.entry.payload == b"hello"
                assert any(holds.values())

    check()


@st.composite
def quorums(draw: st.DrawFn) -> tuple[int, int, int]:
    e = draw(st.integers(1, 5))
    qw = draw(st.integers(1, e))
    qa = draw(st.integers(1, qw))
    return e, qw, qa


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(q=quorums(), data=st.data())
def test_r17_r18_r19_property_recovery_keeps_every_acknowledged_entry_even_from_a_zombie(
    q: tuple[int, int, int], data: st.DataObject
) -> None:
    """The pieces together: a writer's AckTracker against nodes that refuse it once
    fenced; a recovery fences until FenceCoverage, starts at recovery_start and reads
    forward with fencing reads until EntryRecoveryVote says absent, while the old
    writer goes on delivering in between. Every entry the writer ever acknowledged,
    before or during the recovery, is at or below the recovered last entry, and every
    entry up to that one is stored somewhere."""
    e, qw, qa = q
    ensemble = Ensemble(0, members(e))
    tracker = AckTracker(1, qw, qa, ensemble)
    stored: dict[str, dict[int, bytes]] = {member.address: {} for member in ensemble.members}
    lac_seen = dict.fromkeys(stored, -1)
    fenced: set[str] = set()
    in_flight: list[tuple[int, EnsembleMember]] = []
    for entry_id in range(data.draw(st.integers(0, 10))):
        in_flight.extend((entry_id, member) for member in tracker.add(entry_id))

    def deliver(count: int) -> None:
        for _ in range(min(count, len(in_flight))):
            entry_id, member = in_flight.pop(data.draw(st.integers(0, len(in_flight) - 1)))
            if member.address in fenced:
                tracker.record_failure(member)
                continue
            stored[member.address][entry_id] = encode_entry(1, entry_id, entry_id + 1, b"e")
            lac_seen[member.address] = max(lac_seen[member.address], tracker.last_add_confirmed)
            tracker.record_ack(entry_id, member)

    deliver(data.draw(st.integers(0, len(in_flight))))
    coverage = FenceCoverage(ensemble, qw, qa)
    for member in data.draw(st.permutations(ensemble.members)):
        if coverage.covered:
            break
        fenced.add(member.address)
        coverage.record_fenced(member.address)
        deliver(data.draw(st.integers(0, 3)))
    assert coverage.covered
    next_entry = recovery_start([lac_seen[address] for address in fenced], ensemble)
    while True:
        vote = EntryRecoveryVote(1, next_entry, write_set(next_entry, ensemble.members, qw), qa)
        for member in data.draw(st.permutations(vote.write_set)):
            fenced.add(member.address)  # R19: every recovery read fences
            held = stored[member.address].get(next_entry)
            if held is None:
                vote.record_no_such_entry(member.address, member.instance_id)
            else:
                vote.record_entry(member.address, member.instance_id, held)
            deliver(data.draw(st.integers(0, 2)))
            if vote.outcome in (VoteOutcome.PRESENT, VoteOutcome.ABSENT):
                break
        if vote.outcome is not VoteOutcome.PRESENT:
            break
        next_entry += 1
    recovered_last = next_entry - 1
    deliver(len(in_flight))  # the zombie writer finishes: fenced nodes refuse it
    assert tracker.last_add_confirmed <= recovered_last
    # and the recovered ledger has no hole: each entry up to its end is on a replica
    for entry_id in range(recovered_last + 1):
        assert any(entry_id in stored[m.address] for m in write_set(entry_id, ensemble.members, qw))
