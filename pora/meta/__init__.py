"""The cluster's metadata store: ledger ids, ledger metadata, node registrations and
streams, behind one interface with an embedded SQLite and a ZooKeeper backend."""

from pora.meta.errors import (
    InvalidMetadata,
    LedgerExists,
    MetadataError,
    MetadataRecordTooLarge,
    MetadataStoreGone,
    MetadataTimeout,
    MetadataUnavailable,
    MetadataVersionConflict,
    NodeAddressTaken,
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
from pora.meta.store import MetadataConfig, MetadataStore, open_metadata

__all__ = [
    "Ensemble",
    "EnsembleMember",
    "InvalidMetadata",
    "LedgerExists",
    "LedgerMetadata",
    "LedgerState",
    "MetadataConfig",
    "MetadataError",
    "MetadataRecordTooLarge",
    "MetadataStore",
    "MetadataStoreGone",
    "MetadataTimeout",
    "MetadataUnavailable",
    "MetadataVersionConflict",
    "NoSuchLedgerMetadata",
    "NodeAddressTaken",
    "NodeRegistration",
    "RegistrationLost",
    "Versioned",
    "open_metadata",
]
