"""R13: what a node's refusal of an add means for the ledger's writer.

A node answers each entry of an add call with None (stored) or an error. The
first error of a call is sorted here, once, without I/O: a refusal of the ledger
ends the writer (FENCED and CLOSED fence it, UNAUTHORIZED fails it with that
error), a conflicting or oversized entry or a bad argument is a bug or a misuse
that stops the ledger at that entry, and any other error fails the member (R8:
the ensemble changer replaces it). The sender only acts on the answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from journal.errors import PoraError
from ledger.errors import (
    EntryConflict,
    EntryTooLarge,
    InvalidArgument,
    LedgerClosed,
    LedgerFenced,
    Unauthorized,
)


class EndWriter(NamedTuple):
    """The writer ends with `error`; `misuse` when the refusal points at the caller
    or at a bug (an entry refused as such), which is worth an error in the log."""

    error: PoraError
    misuse: bool


class FailMember(NamedTuple):
    """The member that refused fails with `error` (R8), and is replaced."""

    error: PoraError


def first_refusal(outcomes: Iterable[PoraError | None]) -> PoraError | None:
    """The first error among a call's per-entry outcomes (None when all were stored)."""
    for outcome in outcomes:
        if outcome is not None:
            return outcome
    return None


def sort_refusal(ledger_id: int, error: PoraError) -> EndWriter | FailMember:
    """R13: end the writer, or fail the member that refused."""
    if isinstance(error, LedgerClosed):
        # the writer's own close stops its sends before it seals the nodes: a node
        # sealed under a writing writer was sealed by a recovery, which fenced it
        return EndWriter(LedgerFenced(ledger_id), misuse=False)
    if isinstance(error, LedgerFenced | Unauthorized):
        return EndWriter(error, misuse=False)
    if isinstance(error, EntryConflict | EntryTooLarge | InvalidArgument):
        return EndWriter(error, misuse=True)
    return FailMember(error)


__all__ = ["EndWriter", "FailMember", "first_refusal", "sort_refusal"]
