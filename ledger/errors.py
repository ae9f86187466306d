"""Typed errors of ledger operations. Each says what went wrong, where, and what to do."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from journal.errors import PoraError


class LedgerError(PoraError):
    """An operation on one ledger was refused."""

    def __init__(self, ledger_id: int, message: str) -> None:
        self.ledger_id = ledger_id
        super().__init__(message)


class NoSuchLedger(LedgerError):
    def __init__(self, ledger_id: int, where: str = "on this node") -> None:
        super().__init__(ledger_id, f"ledger {ledger_id} does not exist {where}")


class NoSuchEntry(LedgerError):
    def __init__(self, ledger_id: int, entry_id: int) -> None:
        self.entry_id = entry_id
        super().__init__(ledger_id, f"entry {entry_id} of ledger {ledger_id} is not stored here")


class LedgerClosed(LedgerError):
    def __init__(self, ledger_id: int) -> None:
        super().__init__(ledger_id, f"ledger {ledger_id} is closed: it can be read, not written")


class LedgerFenced(LedgerError):
    def __init__(self, ledger_id: int) -> None:
        super().__init__(
            ledger_id,
            f"ledger {ledger_id} is fenced: a recovery shut its writer out; "
            "only recovery adds are accepted",
        )


class LedgerDeleted(LedgerFenced, NoSuchLedger):
    """The ledger was deleted: its writer is shut out for good. A `LedgerFenced` (a
    writer catching that stops the same way, and a node answers FENCED on the wire,
    which every client version takes as the end of its writer) and a `NoSuchLedger`
    (there is nothing left to read)."""

    def __init__(self, ledger_id: int, where: str = "") -> None:
        LedgerError.__init__(
            self,
            ledger_id,
            f"ledger {ledger_id} was deleted{where}: its writer is shut out and its "
            "entries are gone (ledger ids are never reused: write to a new ledger)",
        )


class EntryConflict(LedgerError):
    """The same (ledger, entry) was added before with different bytes."""

    def __init__(self, ledger_id: int, entry_id: int) -> None:
        self.entry_id = entry_id
        super().__init__(
            ledger_id,
            f"entry {entry_id} of ledger {ledger_id} is already stored with different bytes; "
            "entries are immutable (a retry must resend the same payload)",
        )


class EntryTooLarge(LedgerError):
    def __init__(self, ledger_id: int, size: int, limit: int, entry_id: int = -1) -> None:
        self.size = size
        self.limit = limit
        #: the entry, where known (-1: not named)
        self.entry_id = entry_id
        which = f"entry {entry_id}" if entry_id >= 0 else "entry"
        super().__init__(
            ledger_id,
            f"{which} of {size} bytes for ledger {ledger_id} exceeds the node's limit of "
            f"{limit} bytes (option entry_bytes_max)",
        )


class InvalidArgument(PoraError, ValueError):
    """A call or a request carries a value no operation accepts (a negative id, a write
    quorum larger than the ensemble). Also a ValueError, so code that guards a call
    with `except ValueError` keeps working; `InvalidArgumentType` is the one for a
    value of the wrong type."""


class InvalidArgumentType(InvalidArgument, TypeError):
    """A call got a value of the wrong type (a float quorum, a URL that is not a str,
    a password of None). Also a TypeError, what Python raises for a wrong type."""


class NodeClosed(PoraError):
    """The node is shutting down or has stopped; the request was not performed."""


class StorageCorruption(PoraError):
    """Stored bytes fail their checksum or do not match what the index says."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"corrupt data in {path} at byte {offset}: {reason}; "
            "run `pora verify` on the stopped node"
        )


class Unauthorized(LedgerError):
    """The request's master key is not the ledger's (a wrong ledger password)."""

    def __init__(self, ledger_id: int) -> None:
        super().__init__(
            ledger_id,
            f"wrong master key for ledger {ledger_id}: the ledger's password is not the one "
            "it was created with",
        )


class NodeReadOnly(PoraError):
    """The node takes no writes for now (its disk is nearly full); reads go on."""


class FlushFailed(PoraError):
    """Ledgers could not write their entries to their entry logs and index (a full
    or failing disk). Nothing is lost: those entries are in the journal, which is
    kept until a flush of them succeeds."""

    def __init__(self, ledger_ids: Iterable[int], message: str) -> None:
        #: the ledgers whose flush failed, ascending
        self.ledger_ids = sorted(ledger_ids)
        super().__init__(message)


def ledger_list(ledger_ids: Sequence[int], shown_max: int = 10) -> str:
    """`ledger_ids` for a message: the first few, then how many more."""
    shown = ", ".join(str(ledger_id) for ledger_id in ledger_ids[:shown_max])
    if len(ledger_ids) > shown_max:
        shown += f" and {len(ledger_ids) - shown_max} more"
    return shown


def describe_os_error(error: OSError) -> str:
    """An OS error as its errno name and text (`ENOSPC (No space left on device)`),
    without Python's repr; LevelDB's errors (plyvel) carry their message as bytes."""
    if error.errno is not None:
        name = errno.errorcode.get(error.errno, f"errno {error.errno}")
        return f"{name} ({error.strerror or os.strerror(error.errno)})"
    if error.args and isinstance(error.args[0], bytes):
        return error.args[0].decode("utf-8", "replace")
    return str(error)


class UnindexedEntryLog(FileExistsError, PoraError):
    """A new ledger's entry log is to be created, but a file of that name exists and
    may hold entries: it is never truncated or overwritten.

    An OSError (FileExistsError), so a flush that meets it fails the way a disk error
    fails it: its entries stay in memory and in the journal, nothing is lost.
    """

    def __init__(self, path: Path, ledger_id: int, reason: str) -> None:
        self.path = path
        self.ledger_id = ledger_id
        self.reason = reason
        self.message = (
            f"the entry log {path} of ledger {ledger_id} already exists and {reason}, but "
            f"the index has no record of ledger {ledger_id}'s log: refusing to overwrite it. "
            "If the index was lost or damaged, stop the node and run `pora verify "
            f"--rebuild-index`; if ledger {ledger_id} was deleted and the node crashed "
            "before the file was removed, remove the file"
        )
        super().__init__(errno.EEXIST, self.message, str(path))

    def __str__(self) -> str:
        return self.message
