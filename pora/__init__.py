"""Pora: a durable, replicated ledger store on trio.

`open_node` runs a storage node in-process; `connect_node` talks to one over the
network. The errors their operations raise are gathered in `pora.errors` and
re-exported here.
"""

from ledger.state import LedgerInfo
from netio.security import master_key_from_password
from pora.client.node_client import NodeClient, NodeInfo, connect_node
from pora.errors import (
    ConnectionLost,
    DataDirError,
    DataDirLocked,
    EntryConflict,
    EntryTooLarge,
    FlushFailed,
    IndexMissing,
    InvalidArgument,
    JournalCorruption,
    JournalError,
    JournalFormatError,
    JournalGap,
    JournalNoSpace,
    LedgerClosed,
    LedgerError,
    LedgerFenced,
    NodeClosed,
    NodeOverloaded,
    NodeReadOnly,
    NoSuchEntry,
    NoSuchLedger,
    PoraError,
    ProtocolError,
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
    "LedgerInfo",
    "NoSuchEntry",
    "NoSuchLedger",
    "Node",
    "NodeClient",
    "NodeClosed",
    "NodeConfig",
    "NodeInfo",
    "NodeOverloaded",
    "NodeReadOnly",
    "NodeStatistics",
    "PoraError",
    "ProtocolError",
    "RemoteError",
    "RequestTimeout",
    "StorageCorruption",
    "Unauthorized",
    "UnindexedEntryLog",
    "connect_node",
    "master_key_from_password",
    "open_node",
]
