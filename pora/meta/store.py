"""The metadata store's interface, `MetadataStore`. `open_metadata(url)`
(backends.py) picks a backend by URL; `MetadataConfig` (config.py) tunes them.

The interface is shaped so that SQLite and ZooKeeper (kazoo) behave the same: every
record carries a version and every change names the version it read (ZooKeeper's
`set(path, data, version)`); node registrations are liveness-bound (a lease renewed by
`renew_node` in SQLite, an ephemeral znode kept by the session in ZooKeeper, where
`renew_node` only checks the node still holds it); `watch_ledger` yields each new
version (a polled change counter in SQLite, a re-armed watch in ZooKeeper). Every call
is async and works under asyncio and trio (anyio); backends run their blocking client
in worker threads and give up on a call after `MetadataConfig.call_timeout_s`.

Documents are named, versioned byte strings (`create_document` .. `watch_document`)
grouped in spaces: the streams layer keeps each stream in documents and changes them
only by compare-and-set; pora/meta/documents.py holds the rules for their names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from pora.meta.config import DEFAULT_LEASE_S
from pora.meta.records import LedgerMetadata, NodeRegistration, Versioned


class MetadataStore(Protocol):
    @property
    def url(self) -> str: ...

    async def allocate_ledger_id(self) -> int:
        """A ledger id no process sharing the store was or will be given."""
        ...

    async def create_ledger(self, meta: LedgerMetadata) -> Versioned[LedgerMetadata]:
        """Store a new record at version 0; LedgerExists if the id has one."""
        ...

    async def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]: ...

    async def update_ledger(
        self, meta: LedgerMetadata, expected_version: int
    ) -> Versioned[LedgerMetadata]:
        """Replace the record if it is still at `expected_version`, else raise
        MetadataVersionConflict (NoSuchLedgerMetadata if it is gone)."""
        ...

    async def delete_ledger(self, ledger_id: int, expected_version: int) -> None: ...

    async def list_ledgers(
        self, after_id: int = -1, limit: int = 1000
    ) -> list[Versioned[LedgerMetadata]]:
        """Up to `limit` records with ids above `after_id`, by increasing id; the next
        page starts after the last id of this one."""
        ...

    def watch_ledger(
        self, ledger_id: int, after_version: int | None = None
    ) -> AsyncIterator[Versioned[LedgerMetadata]]:
        """Yield the record each time its version moves past the last one yielded
        (starting from `after_version`, or the version current when the watch starts).
        Versions in between may be skipped; the iteration ends when the ledger is
        deleted. NoSuchLedgerMetadata if it has no record at the start."""
        ...

    async def register_node(
        self, registration: NodeRegistration, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        """Register a node for `lease_s`; NodeAddressTaken if another instance id holds
        the address live; the same instance id takes its own registration back."""
        ...

    async def renew_node(
        self, address: str, instance_id: str, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        """Extend this instance's lease; RegistrationLost if it no longer holds it."""
        ...

    async def update_registration(self, registration: NodeRegistration) -> None:
        """Change read-only, free bytes or rack; RegistrationLost if not held."""
        ...

    async def unregister_node(self, address: str, instance_id: str) -> None:
        """Remove this instance's registration (nothing if it holds none)."""
        ...

    async def list_nodes(self, writable_only: bool = False) -> list[NodeRegistration]:
        """Live registrations by address (an expired lease counts as gone)."""
        ...

    # --- documents: named, versioned bytes in spaces (docs/metadata.md, "Documents").
    # A space and a name are non-empty str of at most 200 UTF-8 bytes without NUL,
    # and a space holds no '/' (InvalidMetadata otherwise); data is at most
    # MetadataConfig.record_bytes_max bytes (MetadataRecordTooLarge, nothing written).

    async def create_document(self, space: str, name: str, data: bytes) -> Versioned[bytes]:
        """Store a new document at version 0; DocumentExists if (space, name) is taken."""
        ...

    async def read_document(self, space: str, name: str) -> Versioned[bytes]:
        """The document and its version; NoSuchDocument if there is none."""
        ...

    async def update_document(
        self, space: str, name: str, data: bytes, expected_version: int
    ) -> Versioned[bytes]:
        """Replace the data if the document is still at `expected_version` (it moves to
        the next version), else MetadataVersionConflict (NoSuchDocument if it is gone)."""
        ...

    async def delete_document(self, space: str, name: str, expected_version: int) -> None:
        """Delete the document if it is still at `expected_version`, else
        MetadataVersionConflict (NoSuchDocument if it is gone)."""
        ...

    async def list_documents(self, space: str, after: str = "", limit: int = 1000) -> list[str]:
        """Up to `limit` names in `space` greater than `after`, sorted bytewise on their
        UTF-8 (as str order is); the next page starts after the last name of this one.
        An empty or unknown space lists nothing."""
        ...

    def watch_document(
        self, space: str, name: str, after_version: int | None = None
    ) -> AsyncIterator[Versioned[bytes]]:
        """As `watch_ledger`: yield the document each time its version moves past the
        last one yielded (from `after_version`, or the version current when the watch
        starts); versions in between may be skipped; the iteration ends when the
        document is deleted. NoSuchDocument if it is absent at the start."""
        ...

    # --- the cluster's identity and the nodes' marks (docs/metadata.md)

    async def cluster_id(self) -> str | None:
        """The cluster id made when the store was set up; None if it never was (a
        store that is new, or older than cluster ids)."""
        ...

    async def initialize_cluster(self) -> str:
        """Give the store a new random cluster id unless it has one; returns the id
        it holds then. Safe to race: every caller gets the one id stored."""
        ...

    async def node_mark(self, instance_id: str) -> int | None:
        """The mark `advance_node_mark` left for this node instance (None if none)."""
        ...

    async def advance_node_mark(self, instance_id: str, mark: int) -> None:
        """Raise this node instance's mark to `mark`; a lower one leaves it as it is
        (a mark never goes back)."""
        ...

    # --- locks held while their holder lives (docs/rereplication.md, A4). A name is a
    # document name (check_document_key's rules); a holder a non-empty str naming the
    # process. SQLite: a row with a lease the holder renews; ZooKeeper: an ephemeral
    # znode of the holder's session (its `lease_s` is the session's timeout).

    async def acquire_lock(self, name: str, holder: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
        """Take the lock `name` for `holder` unless another live holder has it; True
        if `holder` holds it now (taking it again is allowed and renews it)."""
        ...

    async def renew_lock(self, name: str, holder: str, lease_s: float = DEFAULT_LEASE_S) -> None:
        """Extend `holder`'s lock; LockLost if it no longer holds it."""
        ...

    async def release_lock(self, name: str, holder: str) -> None:
        """Give the lock back (nothing if `holder` does not hold it)."""
        ...

    async def aclose(self) -> None: ...
