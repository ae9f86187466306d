"""Every error Pora raises on purpose, in one place.

Each is defined in the lowest package that raises it: the journal's in
`journal.errors` (with the root, `PoraError`), the ledgers' and the node's in
`ledger.errors`, the wire's and the client's in `netio.errors`, the data dir's in
`pora.node.datadir`, the metadata store's in `pora.meta.errors`, the replicating
client's in `pora.client.replication.errors` (and `ClientClosed` with the writer),
the streams' in `pora.streams.errors`. An application
imports them from here or from `pora`.
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
    InvalidArgumentType,
    LedgerClosed,
    LedgerDeleted,
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
from netio.errors import (
    ConnectionLost,
    InstanceMismatch,
    NodeOverloaded,
    ProtocolError,
    RemoteError,
    RequestTimeout,
)
from pora.client.replication.errors import (
    ClientClosed,
    DeleteFailed,
    EntryDamaged,
    EntryLost,
    EntryUnreadable,
    NotEnoughNodes,
    RecoveryFailed,
)
from pora.meta.errors import (
    DocumentExists,
    InvalidMetadata,
    LedgerExists,
    MetadataError,
    MetadataRecordTooLarge,
    MetadataStoreGone,
    MetadataTimeout,
    MetadataUnavailable,
    MetadataVersionConflict,
    NodeAddressTaken,
    NoSuchDocument,
    NoSuchLedgerMetadata,
    RegistrationLost,
)
from pora.node.datadir import DataDirError, DataDirLocked, IndexMissing
from pora.streams.errors import NoSuchStream, StreamExists, StreamSealed, WriterFenced

__all__ = [
    "ClientClosed",
    "ConnectionLost",
    "DataDirError",
    "DataDirLocked",
    "DeleteFailed",
    "DocumentExists",
    "EntryConflict",
    "EntryDamaged",
    "EntryLost",
    "EntryTooLarge",
    "EntryUnreadable",
    "FlushFailed",
    "IndexMissing",
    "InstanceMismatch",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidMetadata",
    "JournalCorruption",
    "JournalError",
    "JournalFormatError",
    "JournalGap",
    "JournalNoSpace",
    "LedgerClosed",
    "LedgerDeleted",
    "LedgerError",
    "LedgerExists",
    "LedgerFenced",
    "MetadataError",
    "MetadataRecordTooLarge",
    "MetadataStoreGone",
    "MetadataTimeout",
    "MetadataUnavailable",
    "MetadataVersionConflict",
    "NoSuchDocument",
    "NoSuchEntry",
    "NoSuchLedger",
    "NoSuchLedgerMetadata",
    "NoSuchStream",
    "NodeAddressTaken",
    "NodeClosed",
    "NodeOverloaded",
    "NodeReadOnly",
    "NotEnoughNodes",
    "PoraError",
    "ProtocolError",
    "RecoveryFailed",
    "RegistrationLost",
    "RemoteError",
    "RequestTimeout",
    "StorageCorruption",
    "StreamExists",
    "StreamSealed",
    "Unauthorized",
    "UnindexedEntryLog",
    "WriterFenced",
]
