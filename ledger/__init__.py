"""Per-ledger private workspaces: memtable, entry log, index; workers and registry."""

from ledger.errors import (
    EntryConflict,
    EntryTooLarge,
    FlushFailed,
    InvalidArgument,
    InvalidArgumentType,
    LedgerClosed,
    LedgerError,
    LedgerFenced,
    NodeClosed,
    NoSuchEntry,
    NoSuchLedger,
    StorageCorruption,
)
from ledger.state import NO_ENTRY, LedgerInfo, LedgerMeta, LedgerState

__all__ = [
    "NO_ENTRY",
    "EntryConflict",
    "EntryTooLarge",
    "FlushFailed",
    "InvalidArgument",
    "InvalidArgumentType",
    "LedgerClosed",
    "LedgerError",
    "LedgerFenced",
    "LedgerInfo",
    "LedgerMeta",
    "LedgerState",
    "NoSuchEntry",
    "NoSuchLedger",
    "NodeClosed",
    "StorageCorruption",
]
