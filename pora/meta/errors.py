"""The metadata store's typed errors, one family under `MetadataError`."""

from journal.errors import PoraError


class MetadataError(PoraError):
    """The metadata store refused or could not perform an operation."""


class MetadataUnavailable(MetadataError):
    """The store cannot be reached or opened; says which URL and what to check."""

    def __init__(self, url: str, reason: str, hint: str) -> None:
        self.url = url
        self.reason = reason
        self.hint = hint
        super().__init__(f"metadata store {url} is unavailable: {reason} ({hint})")


class MetadataTimeout(MetadataUnavailable):
    """A call got no answer within its timeout; whether a write took effect is unknown,
    so a caller reads the record again before retrying it."""


class MetadataStalled(MetadataUnavailable):
    """Every write of a change timed out for longer than its caller retries (a process
    frozen while it holds SQLite's write lock, say: docs/metadata.md); the change was
    given up. Not a MetadataTimeout, so that retry loops end on it."""


class MetadataStoreGone(MetadataUnavailable):
    """The store's file was removed or replaced since this process opened it: the
    process stops using it (whatever it wrote there no other process would see), and
    every later call on the store raises this."""


class MetadataVersionConflict(MetadataError):
    """A compare-and-set named a version that is no longer the record's."""

    def __init__(self, key: str, expected_version: int, actual_version: int | None) -> None:
        self.key = key
        self.expected_version = expected_version
        self.actual_version = actual_version  # None: the record is gone
        now = "deleted" if actual_version is None else f"at version {actual_version}"
        super().__init__(f"{key}: expected version {expected_version}, but it is {now}")


class LedgerExists(MetadataError):
    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        super().__init__(f"ledger {ledger_id} already has metadata")


class NoSuchLedgerMetadata(MetadataError):
    """No metadata record for this ledger id (never created, or deleted)."""

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        super().__init__(f"ledger {ledger_id} has no metadata in the store")


class DocumentExists(MetadataError):
    """A document with this space and name is already stored."""

    def __init__(self, space: str, name: str) -> None:
        self.space = space
        self.name = name
        super().__init__(
            f"document {name!r} in space {space!r} already exists: read it and update it "
            "with its version, or use another name"
        )


class NoSuchDocument(MetadataError):
    """No document with this space and name (never created, or deleted)."""

    def __init__(self, space: str, name: str) -> None:
        self.space = space
        self.name = name
        super().__init__(f"no document {name!r} in space {space!r} in the store")


class InvalidMetadata(MetadataError):
    """A record breaks a rule of its format (quorums, ensembles, sizes)."""


class MetadataRecordTooLarge(InvalidMetadata):
    """An encoded record exceeds the store's record size limit (ZooKeeper's znodes hold
    at most 1 MiB)."""

    def __init__(self, key: str, size: int, limit: int) -> None:
        self.key = key
        self.size = size
        self.limit = limit
        super().__init__(f"{key}: encoded record is {size} bytes, over the limit of {limit}")


class NodeAddressTaken(MetadataError):
    """Another live instance holds a registration for this address."""

    def __init__(self, address: str, holder_instance_id: str, expires_in_s: float | None) -> None:
        self.address = address
        self.holder_instance_id = holder_instance_id
        #: None in ZooKeeper: the holder's session ends a session timeout after it stops
        self.expires_in_s = expires_in_s
        expiry = (
            "held until its ZooKeeper session ends"
            if expires_in_s is None
            else f"lease expires in {expires_in_s:.1f} s"
        )
        super().__init__(
            f"address {address} is registered by another live node instance "
            f"{holder_instance_id} ({expiry}): stop that node or give this one another address"
        )


class RegistrationLost(MetadataError):
    """This instance's registration is gone (expired and taken, or removed)."""

    def __init__(self, address: str, instance_id: str) -> None:
        self.address = address
        self.instance_id = instance_id
        super().__init__(
            f"node {address} (instance {instance_id}) is no longer registered; register again"
        )


class LockLost(MetadataError):
    """A lock this holder took is no longer its own (its lease ran out, or its
    ZooKeeper session ended): the work it guarded must stop before its next write."""

    def __init__(self, name: str, holder: str) -> None:
        self.name = name
        self.holder = holder
        super().__init__(
            f"lock {name!r} is no longer held by {holder!r} (its lease ran out or its "
            "session ended); stop the work it guarded and take the lock again"
        )
