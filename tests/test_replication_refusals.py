"""R13, sorted without an event loop: which refusals of an add end the writer (and
with what error its appends fail), and which only fail the member that gave them."""

from __future__ import annotations

import pytest

from journal.errors import PoraError
from ledger.errors import (
    EntryConflict,
    EntryTooLarge,
    InvalidArgument,
    LedgerClosed,
    LedgerFenced,
    Unauthorized,
)
from netio.errors import RequestTimeout
from pora.client.replication.core.refusals import (
    EndWriter,
    FailMember,
    first_refusal,
    sort_refusal,
)


def test_a_node_sealed_under_the_writer_fences_it() -> None:
    """A writer's own close stops its sends first: CLOSED means a recovery sealed it."""
    verdict = sort_refusal(7, LedgerClosed(7))
    assert isinstance(verdict, EndWriter) and not verdict.misuse
    assert isinstance(verdict.error, LedgerFenced) and verdict.error.ledger_id == 7


@pytest.mark.parametrize("error", [LedgerFenced(7), Unauthorized(7)])
def test_a_fence_or_a_wrong_password_ends_the_writer_with_that_error(error: PoraError) -> None:
    assert sort_refusal(7, error) == EndWriter(error, misuse=False)


@pytest.mark.parametrize(
    "error",
    [EntryConflict(7, 3), EntryTooLarge(7, 5000, 4096, 3), InvalidArgument("bad id")],
)
def test_a_refused_entry_ends_the_writer_as_a_misuse(error: PoraError) -> None:
    assert sort_refusal(7, error) == EndWriter(error, misuse=True)


def test_any_other_error_fails_only_the_member() -> None:
    error = RequestTimeout("no answer")
    assert sort_refusal(7, error) == FailMember(error)


def test_the_first_error_of_a_call_is_the_one_sorted() -> None:
    fenced, unauthorized = LedgerFenced(7), Unauthorized(7)
    assert first_refusal([None, fenced, None, unauthorized]) is fenced
    assert first_refusal([None, None]) is None
