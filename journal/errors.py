"""Errors of the storage layer.

`PoraError` is the root of every error Pora raises on purpose; it lives here, in the
lowest package, so that `journal`, `ledger` and `netio` share one root without
importing each other. `pora` re-exports all of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

#: The longest master key a ledger may have. The journal's KEY record is the
#: on-disk truth of this bound (docs/formats.md); it lives here, beside the
#: InvalidArgument refusals that enforce it, because this is the one module that the
#: journal, the node, the wire codec and the client may all import.
MASTER_KEY_BYTES_MAX: Final = 64


class PoraError(Exception):
    """Root of all errors Pora raises deliberately."""


class JournalError(PoraError):
    """The journal cannot be written or read."""


class JournalFormatError(JournalError):
    """A journal file is not a journal segment, or is of a format version we do not know."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class JournalCorruption(JournalError):
    """A damaged record that is *not* a torn tail: valid data follows it.

    Never skipped silently: recovery stops, and the operator decides (see
    `pora journal verify`).
    """

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"journal corruption in {path} at byte {offset}: {reason}. "
            "Valid records follow, so this is not a torn tail; inspect it with "
            "`pora journal verify` before deciding how to repair the node."
        )


class JournalGap(JournalCorruption):
    """Seqs the journal must hold are in no segment: a segment was deleted or lost.

    Acknowledged entries may have been in it. Never replayed past: recovery stops,
    and the operator restores the segment or decides (docs/operations.md).
    """

    def __init__(
        self, path: Path, first_missing: int, last_missing: int | None, reason: str
    ) -> None:
        self.path = path
        self.offset = 0
        #: the seqs missing: first_missing .. last_missing (None: and every later one)
        self.first_missing = first_missing
        self.last_missing = last_missing
        self.reason = reason
        JournalError.__init__(
            self,
            f"journal gap at {path}: {reason}. Acknowledged entries may be lost: restore "
            "the missing segment file(s) from a backup of this node's journal directory, "
            "then start the node again; without a backup, see docs/operations.md, "
            "'The journal has a gap'",
        )


class JournalNoSpace(JournalError):
    """The journal's filesystem has too little free space for the journal to start:
    a refusal to start (the message says how much is free and needed), not damage."""
