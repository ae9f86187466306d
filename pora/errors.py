"""Every error Pora raises on purpose, in one place.

Each is defined in the lowest package that raises it: the journal's in
`journal.errors` (with the root, `PoraError`), the ledgers' and the node's in
`ledger.errors`, the wire's and the client's in `netio.errors`, the data dir's in
`pora.node.datadir`. An application imports them from here or from `pora`.
"""

from journal.errors import (
    JournalCorruption,
    JournalError,
    JournalFormatError,
    JournalGap,
    JournalNoSpace,
    PoraError,
)
from ledger.errors import (
    EntryConflict,
    EntryTooLarge,
    FlushFailed,
    InvalidArgument,
    LedgerClosed,
    LedgerError,
    LedgerFenced,
    NodeClosed,
    NodeReadOnly,
    NoSuchEntry,
    NoSuchLedger,
    StorageCorruption,
    Unauthorized,
    UnindexedEntryLog,
)
from netio.errors import ConnectionLost, NodeOverloaded, ProtocolError, RemoteError, RequestTimeout
from pora.node.datadir import DataDirError, DataDirLocked, IndexMissing

__all__ = [
    "ConnectionLost",
    "DataDirError",
    "DataDirLocked",
    "EntryConflict",
    "EntryTooLarge",
    "FlushFailed",
    "IndexMissing",
    "InvalidArgument",
    "JournalCorruption",
    "JournalError",
    "JournalFormatError",
    "JournalGap",
    "JournalNoSpace",
    "LedgerClosed",
    "LedgerError",
    "LedgerFenced",
    "NoSuchEntry",
    "NoSuchLedger",
    "NodeClosed",
    "NodeOverloaded",
    "NodeReadOnly",
    "PoraError",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "StorageCorruption",
    "Unauthorized",
    "UnindexedEntryLog",
]
