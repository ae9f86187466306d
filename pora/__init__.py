"""Pora: a durable, replicated ledger store on trio.

`open_node` runs a storage node in-process; `connect_node` talks to one over the
network; `connect` opens a replicating client on a cluster's metadata store
(`Client`: ledgers on ensembles of nodes, written through a `LedgerWriter`, read
through a `LedgerReader`). The errors their operations raise are gathered in
`pora.errors` and re-exported here.
"""

from ledger.state import LedgerInfo
from netio.security import master_key_from_password
from pora.client.node_client import NodeClient, NodeInfo, connect_node
from pora.client.replication.client import Client, connect
from pora.client.replication.config import ClientConfig
from pora.client.replication.reader import LedgerReader
from pora.client.replication.writer import LedgerWriter
from pora.errors import (
    ClientClosed,
    ConnectionLost,
    DataDirError,
    DataDirLocked,
    EntryConflict,
    EntryDamaged,
    EntryLost,
    EntryTooLarge,
    EntryUnreadable,
    FlushFailed,
    IndexMissing,
    InstanceMismatch,
    InvalidArgument,
    InvalidMetadata,
    JournalCorruption,
    JournalError,
    JournalFormatError,
    JournalGap,
    JournalNoSpace,
    LedgerClosed,
    LedgerError,
    LedgerExists,
    LedgerFenced,
    MetadataError,
    MetadataRecordTooLarge,
    MetadataTimeout,
    MetadataUnavailable,
    MetadataVersionConflict,
    NodeAddressTaken,
    NodeClosed,
    NodeOverloaded,
    NodeReadOnly,
    NoSuchEntry,
    NoSuchLedger,
    NoSuchLedgerMetadata,
    NotEnoughNodes,
    PoraError,
    ProtocolError,
    RecoveryFailed,
    RegistrationLost,
    RemoteError,
    RequestTimeout,
    StorageCorruption,
    Unauthorized,
    UnindexedEntryLog,
)
from pora.node import Node, NodeStatistics, open_node
from pora.node.config import NodeConfig

__version__ = "0.1.0"

__all__ = [
    "Client",
    "ClientClosed",
    "ClientConfig",
    "ConnectionLost",
    "DataDirError",
    "DataDirLocked",
    "EntryConflict",
    "EntryDamaged",
    "EntryLost",
    "EntryTooLarge",
    "EntryUnreadable",
    "FlushFailed",
    "IndexMissing",
    "InstanceMismatch",
    "InvalidArgument",
    "InvalidMetadata",
    "JournalCorruption",
    "JournalError",
    "JournalFormatError",
    "JournalGap",
    "JournalNoSpace",
    "LedgerClosed",
    "LedgerError",
    "LedgerExists",
    "LedgerFenced",
    "LedgerInfo",
    "LedgerReader",
    "LedgerWriter",
    "MetadataError",
    "MetadataRecordTooLarge",
    "MetadataTimeout",
    "MetadataUnavailable",
    "MetadataVersionConflict",
    "NoSuchEntry",
    "NoSuchLedger",
    "NoSuchLedgerMetadata",
    "Node",
    "NodeAddressTaken",
    "NodeClient",
    "NodeClosed",
    "NodeConfig",
    "NodeInfo",
    "NodeOverloaded",
    "NodeReadOnly",
    "NodeStatistics",
    "NotEnoughNodes",
    "PoraError",
    "ProtocolError",
    "RecoveryFailed",
    "RegistrationLost",
    "RemoteError",
    "RequestTimeout",
    "StorageCorruption",
    "Unauthorized",
    "UnindexedEntryLog",
    "connect",
    "connect_node",
    "master_key_from_password",
    "open_node",
]
