"""The ledger records a writer or a recovery writes to the metadata store, and the
checks each makes on a record it re-reads (R9, R11, R14, R16, R22).

The record holds a digest of the ledger's master key, never the password nor the key
(the key is what a node accepts as proof of the right to write; anyone who can read
the metadata must not learn it):

    password_digest = SHA-256("pora-ledger-password-digest-v1\\0" || ledger_id i64 || master_key)

with `master_key = master_key_from_password(password)` (netio.security). The ledger id
in the digest makes equal passwords give different digests on different ledgers.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final

from ledger.errors import LedgerClosed, LedgerDeleted, LedgerFenced, Unauthorized
from pora.meta.records import (
    Ensemble,
    EnsembleMember,
    LedgerMetadata,
    LedgerState,
    Versioned,
)

#: never change: the digests of existing ledgers would stop matching
PASSWORD_DIGEST_DOMAIN: Final = b"pora-ledger-password-digest-v1\x00"


def password_digest(ledger_id: int, master_key: bytes) -> bytes:
    """What the record stores to check a ledger's password (32 bytes)."""
    return hashlib.sha256(
        PASSWORD_DIGEST_DOMAIN + struct.pack(">q", ledger_id) + master_key
    ).digest()


def check_password(metadata: LedgerMetadata, master_key: bytes) -> None:
    """Unauthorized unless `master_key` is the ledger's (constant-time compare)."""
    if not hmac.compare_digest(
        metadata.password_digest, password_digest(metadata.ledger_id, master_key)
    ):
        raise Unauthorized(metadata.ledger_id)


def new_ledger(
    ledger_id: int,
    write_quorum: int,
    ack_quorum: int,
    members: Sequence[EnsembleMember],
    master_key: bytes,
    created_ms: int,
    custom: Mapping[str, bytes] | None = None,
    token: int = 0,
) -> LedgerMetadata:
    """R2: an OPEN ledger on one ensemble (placement's choice) starting at entry 0,
    with its incarnation `token` (the caller draws it at random: every entry's crc
    covers it). Raises InvalidMetadata for quorums or custom metadata no store
    accepts."""
    metadata = LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=len(members),
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        ensembles=(Ensemble(0, tuple(members)),),
        password_digest=password_digest(ledger_id, master_key),
        created_ms=created_ms,
        custom=dict(custom or {}),
        token=token,
    )
    metadata.validate()
    return metadata


def with_ensemble_change(metadata: LedgerMetadata, ensemble: Ensemble) -> LedgerMetadata:
    """R9: the record with `ensemble` added (or replacing the last one when it starts at
    the same entry: nothing was acknowledged on that one). A writer changes an OPEN
    ledger; a recovery replacing a member while re-adding (R20) one IN_RECOVERY."""
    if metadata.state is LedgerState.CLOSED:
        raise LedgerClosed(metadata.ledger_id)
    last = metadata.ensembles[-1]
    if ensemble.first_entry_id < last.first_entry_id:
        raise ValueError(
            f"ledger {metadata.ledger_id}: a new ensemble at entry {ensemble.first_entry_id} "
            f"would start before the last one's first entry {last.first_entry_id}"
        )
    if (
        metadata.state is LedgerState.IN_RECOVERY
        and ensemble.writer_members() != last.writer_members()
    ):
        # a recovery only replaces members (R20); the positions keep standing for the
        # writer's members, which later recoveries fence and vote on (R17..R19), even
        # when this ensemble replaces the last one (same first entry)
        raise ValueError(
            f"ledger {metadata.ledger_id}: a recovery ensemble at entry "
            f"{ensemble.first_entry_id} would drop the writer's members "
            f"{[m.address for m in last.writer_members()]}"
        )
    changed = metadata.with_ensemble(ensemble)
    changed.validate()
    return changed


def writer_ensemble_change(metadata: LedgerMetadata, ensemble: Ensemble) -> LedgerMetadata:
    """R9/R11: a writer's ensemble change, made to an OPEN record only: a record in
    recovery or closed belongs to the recovery (or the close), and the writer is
    fenced (LedgerFenced) rather than writing its ensemble into it."""
    if metadata.state is not LedgerState.OPEN:
        raise LedgerFenced(metadata.ledger_id)
    return with_ensemble_change(metadata, ensemble)


def recovery_ensemble(
    last: Ensemble, first: int, replacements: Mapping[EnsembleMember, EnsembleMember]
) -> Ensemble:
    """R20: the ensemble a recovery writes from entry `first` on, `last`'s failed
    members replaced. Each replaced position records the writer's member it stands
    for (carried over when a member that joined in an earlier recovery is replaced
    again; dropped when the writer's own member comes back to its position)."""
    standing = dict(last.stands_for)
    members = []
    for position, member in enumerate(last.members):
        new = replacements.get(member, member)
        if new != member:
            standing.setdefault(position, member)
            if standing[position] == new:
                del standing[position]
        members.append(new)
    return Ensemble(first, tuple(members), tuple(sorted(standing.items(), key=lambda s: s[0])))


def in_recovery(metadata: LedgerMetadata) -> LedgerMetadata:
    """R16: the record a recovery compare-and-sets an OPEN ledger to."""
    if metadata.state is LedgerState.CLOSED:
        raise LedgerClosed(metadata.ledger_id)
    return _with_state(metadata, LedgerState.IN_RECOVERY)


def marked_deleting(metadata: LedgerMetadata) -> LedgerMetadata | None:
    """R26: the record a delete compare-and-sets an OPEN or IN_RECOVERY ledger to
    before it fences: IN_RECOVERY (the writer's ensemble changes are refused, R11)
    and marked deleting (the writer fenced learns why). None when there is nothing
    to write: the ledger is closed (no writer to stop) or already so marked."""
    if metadata.state is LedgerState.CLOSED or metadata.deleting:
        return None
    changed = replace(metadata, state=LedgerState.IN_RECOVERY, deleting=True)
    changed.validate()
    return changed


def why_fenced(ledger_id: int, record: LedgerMetadata | None) -> LedgerFenced:
    """R26: what a fenced writer's appends fail with, from the record re-read after
    the fence (None: the record is gone). A delete's mark or a deleted record:
    LedgerDeleted; anything else (a recovery, a close): LedgerFenced."""
    if record is None:
        return LedgerDeleted(ledger_id, ": its record is gone from the metadata store")
    if record.deleting:
        return LedgerDeleted(ledger_id, " (a delete fenced its writer)")
    return LedgerFenced(ledger_id)


def closed_at(metadata: LedgerMetadata, last_entry_id: int, length: int) -> LedgerMetadata:
    """R14/R21/R22: the record CLOSED at `last_entry_id` with the ledger's `length`.
    R15: a CLOSED record never changes its last entry or length."""
    if metadata.state is LedgerState.CLOSED:
        if (metadata.last_entry_id, metadata.length) == (last_entry_id, length):
            return metadata
        raise LedgerClosed(metadata.ledger_id)
    if last_entry_id < metadata.ensembles[-1].first_entry_id - 1:
        raise ValueError(
            f"ledger {metadata.ledger_id}: closing at entry {last_entry_id} would drop "
            f"entries before the last ensemble's first entry "
            f"{metadata.ensembles[-1].first_entry_id}, acknowledged before it was added (R18)"
        )
    closed = metadata.closed(last_entry_id, length)
    closed.validate()
    return closed


class WriterRetry(enum.Enum):
    RETRY = "retry"  # still OPEN: build the change again on the version re-read
    APPLIED = "applied"  # the change is in the record (a timed-out write that took)


def writer_after_conflict(
    reread: Versioned[LedgerMetadata], intended: Ensemble | None = None
) -> WriterRetry:
    """R11: a writer's compare-and-set failed and it re-read the record. OPEN: retry
    (or, when the re-read record already ends with the `intended` ensemble, the
    change took). IN_RECOVERY or CLOSED: raises LedgerFenced; every pending and later
    append fails with it."""
    metadata = reread.value
    if metadata.state is not LedgerState.OPEN:
        raise LedgerFenced(metadata.ledger_id)
    if intended is not None and metadata.ensembles[-1] == intended:
        return WriterRetry.APPLIED
    return WriterRetry.RETRY


class RecoveryRetry(enum.Enum):
    RETRY = "retry"  # not closed: start again from the record re-read (R16)
    CLOSED = "closed"  # another recovery (or the writer) closed it: that result stands


def recovery_after_conflict(reread: Versioned[LedgerMetadata]) -> RecoveryRetry:
    """R16/R22: a recovery's compare-and-set failed and it re-read the record."""
    if reread.value.state is LedgerState.CLOSED:
        return RecoveryRetry.CLOSED
    return RecoveryRetry.RETRY


def _with_state(metadata: LedgerMetadata, state: LedgerState) -> LedgerMetadata:
    changed = replace(metadata, state=state)
    changed.validate()
    return changed
