"""`lone_error_unwrapped`: a client's `async with` block raises the caller's error as
itself, not inside the ExceptionGroup its task group wraps it in (trio's strict groups,
anyio's under asyncio), so that `except pora.NoSuchLedger` around the block works."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def lone_error_unwrapped() -> Iterator[None]:
    """Around a block whose task group runs only the client's own tasks, which end
    without raising: a group of one holds the block's error (or a failed connect) and
    is unwrapped; a group of several, errors that really happened together, stays."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        error = group.exceptions[0]
        raise error from error.__cause__
