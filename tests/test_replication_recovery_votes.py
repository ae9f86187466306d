"""A recovery's bookkeeping: fencing coverage (R17), the start point (R18) and each
entry's vote (R19), with the BookKeeper lessons each one answers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pora.client.replication.entry_format import encode_entry
from pora.client.replication.quorum import write_set, write_set_positions
from pora.client.replication.recovery_votes import (
    EntryRecoveryVote,
    FenceCoverage,
    VoteOutcome,
    absence_quorum,
    recovery_start,
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


@settings(max_examples=300)
@given(
    e=st.integers(1, 7),
    data=st.data(),
)
def test_r17_property_coverage_iff_no_write_set_has_qa_unfenced_members(
    e: int, data: st.DataObject
) -> None:
    """(e) coverage implies no write set has Qa unfenced members, and the converse."""
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


def test_r18_recovery_starts_after_the_highest_lac_reported() -> None:
    assert recovery_start([3, 7, 5], Ensemble(0, members(3))) == 8
    assert recovery_start([], Ensemble(0, members(3))) == 0


def test_r18_a_just_added_ensemble_is_read_from_its_first_entry_not_from_0() -> None:
    """BookKeeper #2615: the new ensemble's members report LAC -1; entries before its
    first were acknowledged before the change and must not be re-read as absent."""
    assert recovery_start([-1, -1, -1], Ensemble(40, members(3))) == 40
    assert recovery_start([-1, 45], Ensemble(40, members(3))) == 46


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


def test_absence_quorum_bounds() -> None:
    assert absence_quorum(3, 2) == 2
    assert absence_quorum(5, 5) == 1
    with pytest.raises(ValueError):
        absence_quorum(2, 3)


ANSWERS = ["entry", "no_such_entry", "error", "wiped", "damaged", "silent"]


@settings(max_examples=400)
@given(data=st.data())
def test_r19_property_an_absent_vote_never_has_qa_holders(data: st.DataObject) -> None:
    """(d) an entry voted absent cannot have Qa members of its write set holding it:
    with fencing nodes, a holder answers the entry, an error, or nothing; a node that
    does not hold it answers no such entry, an error, or nothing; a wiped holder
    answers from a new instance."""
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
