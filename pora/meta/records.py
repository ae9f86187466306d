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
#: a ledger's incarnation token is an unsigned 64-bit value; 0 stands for none (a
#: record written before tokens existed)
TOKEN_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class Versioned(Generic[T]):
    """A record as read, with the version an update must name."""

    value: T
    version: int


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclass(frozen=True, slots=True)
class EnsembleMember:
    """A node of an ensemble: its address and the instance id of its data dir, so a
    node wiped and restarted at the same address is not taken for the one that held
    the entries.

    Equal by value and hashable. The writer hashes members per turn and per answer
    (its queues per node, its ack counting), so the hash is computed once, at
    construction, and the comparison builds no tuples."""

    address: str
    instance_id: str
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.address, self.instance_id)))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, EnsembleMember) or other.__class__ is not self.__class__:
            return NotImplemented
        return self.address == other.address and self.instance_id == other.instance_id

    def __reduce__(self) -> tuple[type[EnsembleMember], tuple[str, str]]:
        # built again where unpickled: a string's hash differs between processes
        return self.__class__, (self.address, self.instance_id)


@dataclass(frozen=True)
class Ensemble:
    """The nodes that hold the entries from `first_entry_id` until the next ensemble's.

    `stands_for` is written by a recovery that replaced members while re-adding
    (R20): for each position whose member joined in a recovery, the member the
    ledger's writer had there. A member that joined in a recovery holds only what
    recoveries gave it, so a later recovery fences and votes on the writer's members
    (`writer_members`) and never takes a joined member's "no such entry" for absence.
    """

    first_entry_id: int
    members: tuple[EnsembleMember, ...]
    #: (position, the writer's member there), positions increasing; empty for an
    #: ensemble the writer made
    stands_for: tuple[tuple[int, EnsembleMember], ...] = ()

    def writer_members(self) -> tuple[EnsembleMember, ...]:
        """The members the ledger's writer wrote to at these positions."""
        standing = dict(self.stands_for)
        return tuple(standing.get(p, member) for p, member in enumerate(self.members))

    def joined_in_recovery(self) -> tuple[EnsembleMember, ...]:
        """The members that joined in a recovery (they can vouch for what a recovery
        gave them, never for the writer's entries)."""
        return tuple(self.members[p] for p, _ in self.stands_for if p < len(self.members))


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
    #: this incarnation of the ledger id: random, made by create_ledger, covered by
    #: every entry's crc so entries of an earlier ledger of the same id (a metadata
    #: store lost and ids handed out again) never pass as this one's (0: none)
    token: int = 0
    #: IN_RECOVERY for a delete (R26): the writer fenced by it learns the ledger is
    #: being deleted, not recovered
    deleting: bool = False

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
        if not 0 <= self.token <= TOKEN_MAX:
            raise InvalidMetadata(f"ledger {self.ledger_id}: token {self.token} is not a u64")
        if self.deleting and self.state is not LedgerState.IN_RECOVERY:
            raise InvalidMetadata(
                f"ledger {self.ledger_id}: only an IN_RECOVERY record is marked deleting"
            )

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
            self._validate_stands_for(ensemble)

    def _validate_stands_for(self, ensemble: Ensemble) -> None:
        where = f"ledger {self.ledger_id}: ensemble at entry {ensemble.first_entry_id}"
        positions = [position for position, _ in ensemble.stands_for]
        if positions != sorted(set(positions)) or not all(
            0 <= p < self.ensemble_size for p in positions
        ):
            raise InvalidMetadata(
                f"{where}: the positions of members that joined in a recovery must be "
                f"distinct, increasing and below E={self.ensemble_size}, not {positions}"
            )
        for position, writers in ensemble.stands_for:
            if writers == ensemble.members[position]:
                raise InvalidMetadata(
                    f"{where}: position {position} stands for its own member {writers.address}"
                )
        if len({m.address for m in ensemble.writer_members()}) != self.ensemble_size:
            raise InvalidMetadata(f"{where}: the writer's members name a node twice")

    def writer_view(self) -> LedgerMetadata:
        """This record with each ensemble's members as the ledger's writer wrote to them
        (every member that joined in a recovery put back to the one it stands for):
        what fencing (R17), the recovery start (R18) and the votes (R19) go by."""
        return replace(
            self,
            ensembles=tuple(Ensemble(e.first_entry_id, e.writer_members()) for e in self.ensembles),
        )

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return replace(
            self,
            state=LedgerState.CLOSED,
            last_entry_id=last_entry_id,
            length=length,
            deleting=False,
        )

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
            "ensembles": [_encode_ensemble(e) for e in self.ensembles],
            "password_digest": _b64(self.password_digest),
            "created_ms": self.created_ms,
            "custom": {key: _b64(value) for key, value in sorted(self.custom.items())},
        }
        # both optional: a record without them reads as token 0 and not deleting,
        # and a reader that predates them ignores them
        if self.token:
            document["token"] = self.token
        if self.deleting:
            document["deleting"] = True
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
                ensembles=tuple(_decode_ensemble(e) for e in doc["ensembles"]),
                password_digest=_unb64(doc["password_digest"]),
                created_ms=int(doc["created_ms"]),
                state=LedgerState(doc["state"]),
                last_entry_id=int(doc["last_entry_id"]),
                length=int(doc["length"]),
                custom={str(k): _unb64(v) for k, v in doc["custom"].items()},
                format_version=int(doc["format_version"]),
                token=int(doc.get("token", 0)),
                deleting=_flag(doc.get("deleting", False)),
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
    #: marked draining by `pora node decommission` (docs/rereplication.md, A14): filled
    #: in by `list_nodes` from the store's draining marks, never part of the encoding;
    #: `list_nodes(writable_only=True)` leaves such a node out, so nothing new goes there
    draining: bool = False

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


def _encode_ensemble(ensemble: Ensemble) -> list[object]:
    """`[first, [[address, instance], ...]]`, with a third item
    `[[position, address, instance], ...]` (the writer's members that joined members
    stand for) only when a recovery replaced some: records without one read as before."""
    encoded: list[object] = [
        ensemble.first_entry_id,
        [[m.address, m.instance_id] for m in ensemble.members],
    ]
    if ensemble.stands_for:
        encoded.append([[p, m.address, m.instance_id] for p, m in ensemble.stands_for])
    return encoded


def _decode_ensemble(encoded: object) -> Ensemble:
    if not isinstance(encoded, list) or len(encoded) not in (2, 3):
        raise ValueError(
            f"an ensemble is [first, members] or [first, members, stands_for], not {encoded!r}"
        )
    first, nodes, *rest = encoded
    stands_for = tuple(
        (int(p), EnsembleMember(str(a), str(i))) for p, a, i in (rest[0] if rest else ())
    )
    return Ensemble(int(first), tuple(EnsembleMember(str(a), str(i)) for a, i in nodes), stands_for)


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise TypeError(f"expected base64 text, got {type(text).__name__}")
    return base64.b64decode(text, validate=True)
