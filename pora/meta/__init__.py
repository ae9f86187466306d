"""The cluster's metadata store, behind one interface (`store.py`) with an embedded
SQLite and a ZooKeeper backend: ledger ids, ledger records, node registrations, the
cluster's identity and its nodes' marks, and named, versioned documents in spaces, in
which `pora.streams` keeps its streams, their pages and cursors (docs/metadata.md)."""

from pora.meta.backends import open_metadata
from pora.meta.config import MetadataConfig
from pora.meta.errors import (
    DocumentExists,
    InvalidMetadata,
    LedgerExists,
    LockLost,
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
from pora.meta.records import (
    Ensemble,
    EnsembleMember,
    LedgerMetadata,
    LedgerState,
    NodeRegistration,
    Versioned,
)
from pora.meta.store import MetadataStore

__all__ = [
    "DocumentExists",
    "Ensemble",
    "EnsembleMember",
    "InvalidMetadata",
    "LedgerExists",
    "LedgerMetadata",
    "LedgerState",
    "LockLost",
    "MetadataConfig",
    "MetadataError",
    "MetadataRecordTooLarge",
    "MetadataStore",
    "MetadataStoreGone",
    "MetadataTimeout",
    "MetadataUnavailable",
    "MetadataVersionConflict",
    "NoSuchDocument",
    "NoSuchLedgerMetadata",
    "NodeAddressTaken",
    "NodeRegistration",
    "RegistrationLost",
    "Versioned",
    "open_metadata",
]
