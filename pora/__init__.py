"""Pora: a durable, replicated ledger store on trio.

`open_node` runs a storage node in-process; the errors below are what its
operations raise.
"""

from journal.errors import JournalCorruption, JournalError, JournalFormatError, PoraError
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
)
from ledger.state import LedgerInfo
from netio.errors import ConnectionLost, NodeOverloaded, ProtocolError, RemoteError, RequestTimeout
from netio.security import master_key_from_password
from pora.client.node_client import NodeClient, NodeInfo, connect_node
from pora.node import Node, NodeStatistics, open_node
from pora.node.config import NodeConfig
from pora.node.datadir import DataDirError, DataDirLocked

__version__ = "0.1.0"

__all__ = [
    "ConnectionLost",
    "DataDirError",
    "DataDirLocked",
    "EntryConflict",
    "EntryTooLarge",
    "FlushFailed",
    "InvalidArgument",
    "JournalCorruption",
    "JournalError",
    "JournalFormatError",
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
    "connect_node",
    "master_key_from_password",
    "open_node",
]
