"""The records the metadata store keeps: ledger metadata and node registrations, each
validated and encoded the same way by every backend (JSON, bytes in base64;
docs/metadata.md gives the format)."""

from __future__ import annotations

import base64
import binascii
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from pora.meta.errors import InvalidMetadata, MetadataRecordTooLarge

T = TypeVar("T")

LEDGER_FORMAT_VERSION = 1
#: ZooKeeper's default znode limit (jute.maxbuffer); every backend refuses larger records
RECORD_BYTES_MAX = 1024 * 1024
ENSEMBLE_SIZE_MAX = 64
CUSTOM_KEYS_MAX = 256
PASSWORD_DIGEST_BYTES_MAX = 64


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A record as read, with the version an update must name."""

    value: T
    version: int


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclass(frozen=True)
class EnsembleMember:
    """A node of an ensemble: its address and the instance id of its data dir, so a
    node wiped and restarted at the same address is not taken for the one that held
    the entries."""

    address: str
    instance_id: str


@dataclass(frozen=True)
class Ensemble:
    """The nodes that hold the entries from `first_entry_id` until the next ensemble's."""

    first_entry_id: int
    members: tuple[EnsembleMember, ...]


@dataclass(frozen=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    ensembles: tuple[Ensemble, ...]
    password_digest: bytes
    created_ms: int
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1  # meaningful once CLOSED
    length: int = 0  # bytes of payload, meaningful once CLOSED
    custom: Mapping[str, bytes] = field(default_factory=dict)
    format_version: int = LEDGER_FORMAT_VERSION

    def validate(self) -> None:
        """Raise InvalidMetadata for a record no backend may store."""
        for name in ("ledger_id", "ensemble_size", "write_quorum", "ack_quorum"):
            value = getattr(self, name)
            # a bool is an int to Python, a float survives JSON: neither is a quorum
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidMetadata(
                    f"ledger {self.ledger_id!r}: {name} must be an int, got {value!r}"
                )
        if self.ledger_id < 0:
            raise InvalidMetadata(f"ledger id {self.ledger_id} is negative")
        if self.format_version != LEDGER_FORMAT_VERSION:
            raise InvalidMetadata(f"ledger format version {self.format_version} is unknown")
        e, qw, qa = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not ENSEMBLE_SIZE_MAX >= e >= qw >= qa >= 1:
            raise InvalidMetadata(
                f"ledger {self.ledger_id}: quorums E={e} Qw={qw} Qa={qa} break "
                f"{ENSEMBLE_SIZE_MAX} >= E >= Qw >= Qa >= 1"
            )
        self._validate_ensembles()
        if self.state is not LedgerState.CLOSED and (self.last_entry_id, self.length) != (-1, 0):
            raise InvalidMetadata(
                f"ledger {self.ledger_id}: last entry and length are set only once closed"
            )
        if self.last_entry_id < -1 or self.length < 0:
            raise InvalidMetadata(f"ledger {self.ledger_id}: negative last entry or length")
        if len(self.password_digest) > PASSWORD_DIGEST_BYTES_MAX:
            raise InvalidMetadata(f"ledger {self.ledger_id}: password digest is too long")
        if len(self.custom) > CUSTOM_KEYS_MAX:
            raise InvalidMetadata(f"ledger {self.ledger_id}: over {CUSTOM_KEYS_MAX} custom keys")

    def _validate_ensembles(self) -> None:
        if not self.ensembles or self.ensembles[0].first_entry_id != 0:
            raise InvalidMetadata(f"ledger {self.ledger_id}: the first ensemble starts at entry 0")
        previous = -1
        for ensemble in self.ensembles:
            if ensemble.first_entry_id <= previous:
                raise InvalidMetadata(
                    f"ledger {self.ledger_id}: ensembles' first entry ids must increase"
                )
            previous = ensemble.first_entry_id
            if len(ensemble.members) != self.ensemble_size:
                raise InvalidMetadata(
                    f"ledger {self.ledger_id}: ensemble at entry {ensemble.first_entry_id} "
                    f"has {len(ensemble.members)} nodes, not E={self.ensemble_size}"
                )
            if len({member.address for member in ensemble.members}) != self.ensemble_size:
                raise InvalidMetadata(
                    f"ledger {self.ledger_id}: ensemble at entry {ensemble.first_entry_id} "
                    "names a node twice"
                )

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return replace(self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length)

    def with_ensemble(self, ensemble: Ensemble) -> LedgerMetadata:
        """This record with one more ensemble (an ensemble change); an ensemble starting
        at the same entry as the last one replaces it (no entry was written to it)."""
        kept = tuple(e for e in self.ensembles if e.first_entry_id < ensemble.first_entry_id)
        return replace(self, ensembles=(*kept, ensemble))

    def encode(self, limit: int = RECORD_BYTES_MAX) -> bytes:
        self.validate()
        document = {
            "format_version": self.format_version,
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "ensembles": [
                [e.first_entry_id, [[m.address, m.instance_id] for m in e.members]]
                for e in self.ensembles
            ],
            "password_digest": _b64(self.password_digest),
            "created_ms": self.created_ms,
            "custom": {key: _b64(value) for key, value in sorted(self.custom.items())},
        }
        data = json.dumps(document, separators=(",", ":")).encode()
        if len(data) > limit:
            raise MetadataRecordTooLarge(f"ledger {self.ledger_id}", len(data), limit)
        return data

    @classmethod
    def decode(cls, data: bytes) -> LedgerMetadata:
        try:
            doc = json.loads(data)
            meta = cls(
                ledger_id=int(doc["ledger_id"]),
                ensemble_size=int(doc["ensemble_size"]),
                write_quorum=int(doc["write_quorum"]),
                ack_quorum=int(doc["ack_quorum"]),
                ensembles=tuple(
                    Ensemble(int(first), tuple(EnsembleMember(str(a), str(i)) for a, i in nodes))
                    for first, nodes in doc["ensembles"]
                ),
                password_digest=_unb64(doc["password_digest"]),
                created_ms=int(doc["created_ms"]),
                state=LedgerState(doc["state"]),
                last_entry_id=int(doc["last_entry_id"]),
                length=int(doc["length"]),
                custom={str(k): _unb64(v) for k, v in doc["custom"].items()},
                format_version=int(doc["format_version"]),
            )
        except (ValueError, KeyError, TypeError, binascii.Error) as error:
            raise InvalidMetadata(f"undecodable ledger metadata: {error!r}") from error
        meta.validate()
        return meta


@dataclass(frozen=True)
class NodeRegistration:
    """A node's liveness-bound record. `last_seen_ms` is filled in by the store."""

    address: str
    instance_id: str
    read_only: bool = False
    free_bytes: int = 0
    rack: str | None = None
    last_seen_ms: int = 0

    def validate(self) -> None:
        if not self.address or not self.instance_id:
            raise InvalidMetadata("a node registration needs an address and an instance id")
        if self.free_bytes < 0:
            raise InvalidMetadata(f"node {self.address}: negative free bytes")

    def encode(self) -> bytes:
        self.validate()
        return json.dumps(
            {
                "address": self.address,
                "instance_id": self.instance_id,
                "read_only": self.read_only,
                "free_bytes": self.free_bytes,
                "rack": self.rack,
                "last_seen_ms": self.last_seen_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> NodeRegistration:
        try:
            doc = json.loads(data)
            rack = doc["rack"]
            return cls(
                address=str(doc["address"]),
                instance_id=str(doc["instance_id"]),
                read_only=bool(doc["read_only"]),
                free_bytes=int(doc["free_bytes"]),
                rack=None if rack is None else str(rack),
                last_seen_ms=int(doc["last_seen_ms"]),
            )
        except (ValueError, KeyError, TypeError) as error:
            raise InvalidMetadata(f"undecodable node registration: {error!r}") from error


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"expected base64 text, got {type(text).__name__}")
    return base64.b64decode(text, validate=True)
