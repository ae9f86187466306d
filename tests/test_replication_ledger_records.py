"""The ledger records a writer or a recovery builds, and the checks on a record re-read
after a failed compare-and-set (R2, R9, R11, R14, R15, R16, R22)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger.errors import LedgerClosed, LedgerFenced, Unauthorized
from netio.security import master_key_from_password
from pora.client.replication.core.ledger_records import (
    RecoveryRetry,
    WriterRetry,
    check_password,
    closed_at,
    in_recovery,
    new_ledger,
    password_digest,
    recovery_after_conflict,
    recovery_ensemble,
    with_ensemble_change,
    writer_after_conflict,
    writer_ensemble_change,
)
from pora.meta.errors import InvalidMetadata
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata, LedgerState, Versioned

KEY = master_key_from_password("pw")


def m(i: int) -> EnsembleMember:
    return EnsembleMember(f"n{i}:3181", f"inst-{i}")


def ledger(ledger_id: int = 5) -> LedgerMetadata:
    return new_ledger(ledger_id, 3, 2, (m(0), m(1), m(2)), KEY, 1234, {"app": b"demo"})


def test_r2_a_new_ledger_is_open_on_one_ensemble_from_entry_0() -> None:
    record = ledger()
    assert record.state is LedgerState.OPEN
    assert record.ensembles == (Ensemble(0, (m(0), m(1), m(2))),)
    assert (record.ensemble_size, record.write_quorum, record.ack_quorum) == (3, 3, 2)
    assert record.custom == {"app": b"demo"}
    assert LedgerMetadata.decode(record.encode()) == record
    with pytest.raises(InvalidMetadata, match="E=3 Qw=4"):
        new_ledger(5, 4, 2, (m(0), m(1), m(2)), KEY, 0)


def test_the_record_holds_neither_the_password_nor_the_key_and_checks_them() -> None:
    record = ledger()
    encoded = record.encode()
    assert b"pw" not in record.password_digest
    assert KEY not in record.password_digest
    assert KEY not in encoded
    check_password(record, KEY)
    with pytest.raises(Unauthorized):
        check_password(record, master_key_from_password("other"))
    # equal passwords give different digests on different ledgers
    assert password_digest(5, KEY) != password_digest(6, KEY)
    assert len(password_digest(5, KEY)) == 32


def test_r9_an_ensemble_change_adds_an_ensemble_or_replaces_one_at_the_same_entry() -> None:
    record = ledger()
    changed = with_ensemble_change(record, Ensemble(4, (m(0), m(7), m(2))))
    assert [e.first_entry_id for e in changed.ensembles] == [0, 4]
    again = with_ensemble_change(changed, Ensemble(4, (m(0), m(7), m(8))))
    assert again.ensembles[-1].members == (m(0), m(7), m(8))
    assert len(again.ensembles) == 2
    with pytest.raises(ValueError, match="before the last one's first entry"):
        with_ensemble_change(changed, Ensemble(2, (m(0), m(7), m(8))))
    with pytest.raises(InvalidMetadata, match="names a node twice"):
        with_ensemble_change(changed, Ensemble(6, (m(0), m(0), m(8))))
    with pytest.raises(LedgerClosed):
        with_ensemble_change(closed_at(record, -1, 0), Ensemble(0, (m(0), m(7), m(8))))
    # a recovery replacing a member while re-adding (R20) keeps the record IN_RECOVERY,
    # and the replaced position still names the writer's member, even at the same entry
    recovering = with_ensemble_change(
        in_recovery(record), recovery_ensemble(record.ensembles[-1], 0, {m(0): m(9)})
    )
    assert recovering.state is LedgerState.IN_RECOVERY
    assert recovering.ensembles == (Ensemble(0, (m(9), m(1), m(2)), ((0, m(0)),)),)
    assert recovering.writer_view().ensembles == record.ensembles
    with pytest.raises(ValueError, match="would drop the writer's members"):
        with_ensemble_change(in_recovery(record), Ensemble(0, (m(9), m(1), m(2))))


def test_r11_a_writer_never_writes_its_ensemble_into_a_record_in_recovery() -> None:
    """A record the writer re-read (its close's compare-and-set conflicted) may be a
    recovery's: its next ensemble change fences it instead of landing in that record."""
    record = ledger()
    change = Ensemble(4, (m(0), m(7), m(2)))
    assert writer_ensemble_change(record, change).ensembles[-1] == change
    for taken in (in_recovery(record), closed_at(in_recovery(record), 2, 30)):
        with pytest.raises(LedgerFenced):
            writer_ensemble_change(taken, change)


def test_r20_a_position_keeps_standing_for_the_writers_member_through_recoveries() -> None:
    writers = Ensemble(4, (m(0), m(1), m(2)))
    first = recovery_ensemble(writers, 6, {m(0): m(9)})
    assert first.joined_in_recovery() == (m(9),)
    # a later recovery replaces the joined member, and a writer's member
    second = recovery_ensemble(first, 8, {m(9): m(10), m(2): m(11)})
    assert second.members == (m(10), m(1), m(11))
    assert second.stands_for == ((0, m(0)), (2, m(2)))
    assert second.writer_members() == writers.members
    # the writer's own member back at its position stands for no one
    back = recovery_ensemble(second, 8, {m(10): m(0)})
    assert back.stands_for == ((2, m(2)),)
    assert back.writer_members() == writers.members


def test_stands_for_is_encoded_and_records_without_it_read_as_before() -> None:
    record = ledger()
    old_encoding = record.encode()
    assert b"stands" not in old_encoding
    assert old_encoding.count(b"inst-") == 3  # two items per ensemble, as always
    recovering = with_ensemble_change(
        in_recovery(record), recovery_ensemble(record.ensembles[-1], 3, {m(1): m(9)})
    )
    assert LedgerMetadata.decode(recovering.encode()) == recovering
    assert b'[[1,"n1:3181","inst-1"]]' in recovering.encode()
    bad = [
        (((3, m(4)),), "below E=3"),
        (((1, m(4)), (0, m(5))), "distinct, increasing"),
        (((0, m(0)),), "stands for its own member"),
        (((0, m(1)),), "the writer's members name a node twice"),
    ]
    for stands_for, error in bad:
        broken = Ensemble(0, (m(0), m(1), m(2)), stands_for)
        with pytest.raises(InvalidMetadata, match=error):
            replace(record, ensembles=(broken,)).validate()
    with pytest.raises(InvalidMetadata, match="an ensemble is"):
        LedgerMetadata.decode(old_encoding.replace(b'[[0,[["n0', b'[[0,4,4,[["n0'))


def test_r11_a_writer_retries_on_an_open_record_and_is_fenced_otherwise() -> None:
    record = ledger()
    intended = Ensemble(3, (m(0), m(7), m(2)))
    assert writer_after_conflict(Versioned(record, 2), intended) is WriterRetry.RETRY
    applied = with_ensemble_change(record, intended)
    assert writer_after_conflict(Versioned(applied, 3), intended) is WriterRetry.APPLIED
    for fenced in (in_recovery(record), closed_at(in_recovery(record), 2, 30)):
        with pytest.raises(LedgerFenced):
            writer_after_conflict(Versioned(fenced, 3), intended)


def test_r14_r22_closing_sets_the_last_entry_and_length() -> None:
    record = with_ensemble_change(ledger(), Ensemble(10, (m(0), m(7), m(2))))
    closed = closed_at(in_recovery(record), 12, 700)
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 12, 700)
    # R21: nothing present after the last ensemble's start: closed at its first entry - 1
    assert closed_at(record, 9, 500).last_entry_id == 9
    with pytest.raises(ValueError, match="R18"):
        closed_at(record, 8, 400)


def test_r15_a_closed_record_never_changes_its_last_entry_or_length() -> None:
    closed = closed_at(ledger(), 4, 50)
    assert closed_at(closed, 4, 50) is closed
    with pytest.raises(LedgerClosed):
        closed_at(closed, 5, 60)
    with pytest.raises(LedgerClosed):
        in_recovery(closed)


def test_r16_r22_a_recovery_after_a_conflict_retries_unless_another_closed_it() -> None:
    record = ledger()
    assert recovery_after_conflict(Versioned(record, 1)) is RecoveryRetry.RETRY
    assert recovery_after_conflict(Versioned(in_recovery(record), 2)) is RecoveryRetry.RETRY
    closed = closed_at(in_recovery(record), 3, 9)
    assert recovery_after_conflict(Versioned(closed, 3)) is RecoveryRetry.CLOSED
    assert in_recovery(record).last_entry_id == -1
