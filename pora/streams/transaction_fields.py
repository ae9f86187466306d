"""The stream document's transaction fields (docs/streams.md, "Transactions";
docs/metadata.md): the pending transactions with their segments, the recorded commit
keys and the app versions, with their validation and JSON form. No I/O; the changes
to them are in transaction_changes.py.

Commit keys are kept as digests (12 bytes of SHA-256, base64url: 16 characters) so
that 10,000 of them take some 300 KB of the document whatever the keys' length.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ledger.errors import InvalidArgument, InvalidArgumentType
from pora.client.replication.arguments import is_int

if TYPE_CHECKING:
    pass

COMMIT_KEYS_MAX_DEFAULT = 10_000
#: the most commit_keys_max may be: with every other field at its bound the document
#: then stays under 1 MiB (tests/test_stream_transactions_model.py measures it)
COMMIT_KEYS_MAX_LIMIT = 10_000
TXN_IDLE_S_MAX_DEFAULT = 24 * 3600.0
#: the defaults of the config's limits: pending transactions a stream holds at once,
#: pending segments all of them hold together, and app ids recorded (one number each,
#: kept forever)
TXN_PENDING_MAX_DEFAULT = 500
TXN_SEGMENTS_MAX_DEFAULT = 3000
APP_IDS_MAX_DEFAULT = 1000
COMMIT_KEY_CHARS_MAX = 1024
APP_ID_CHARS_MAX = 128
#: what one item of each limited field takes of the document at most (JSON, numbers of
#: 19 digits, an app id of 128 ASCII characters), and what the limits together may make
#: the transaction fields take: with the head's 1,000 segments and 200 pages and the
#: attributes at their bound the document then stays under a metadata record's 1 MiB
#: (tests/test_stream_transactions_model.py fills each limit's corner and measures it)
COMMIT_KEY_BYTES = 44
APP_ID_BYTES = 180
PENDING_TXN_BYTES = 82
PENDING_SEGMENT_BYTES = 44
TRANSACTION_FIELDS_BYTES_MAX = 800_000
TXN_ID_PATTERN = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class PendingSegment:
    """A segment of a pending transaction: durable, invisible until the commit."""

    ledger_id: int
    created_ms: int


@dataclass(frozen=True)
class PendingTransaction:
    id: str
    created_ms: int
    #: the last open_segment or commit attempt (not appends): the idle clock of
    #: `collect_abandoned_transactions`
    active_ms: int
    #: by creation
    segments: tuple[PendingSegment, ...] = ()


@dataclass(frozen=True)
class CommitKey:
    """A commit key recorded (as its digest) with the commit number it applied as."""

    digest: str
    commit: int


@dataclass(frozen=True)
class AppVersion:
    """The last version applied for an app id, and the commit it applied as."""

    app_id: str
    version: int
    commit: int


def commit_key_digest(key: object) -> str:
    """The digest a commit key is recorded as; InvalidArgument for a bad key."""
    if not isinstance(key, str):
        raise InvalidArgumentType(f"a commit key must be a str, not {type(key).__name__}")
    if not 0 < len(key) <= COMMIT_KEY_CHARS_MAX:
        raise InvalidArgument(
            f"a commit key has 1 to {COMMIT_KEY_CHARS_MAX} characters, not {len(key)}"
        )
    digest = hashlib.sha256(key.encode()).digest()[:12]
    return base64.urlsafe_b64encode(digest).decode()


def check_app_version(app_id: object, version: object) -> tuple[str, int] | None:
    """(app_id, version) both given, or None for neither; InvalidArgument otherwise."""
    if app_id is None and version is None:
        return None
    if app_id is None or version is None:
        raise InvalidArgument("give app_id and version together (or neither)")
    if not isinstance(app_id, str):
        raise InvalidArgumentType(f"app_id must be a str, not {type(app_id).__name__}")
    if not 0 < len(app_id) <= APP_ID_CHARS_MAX:
        raise InvalidArgument(f"app_id has 1 to {APP_ID_CHARS_MAX} characters, not {len(app_id)}")
    if not is_int(version):
        raise InvalidArgumentType(f"version must be an int, not {type(version).__name__}")
    assert isinstance(version, int)
    if not 0 <= version < 2**63:
        raise InvalidArgument(f"version={version} must be in [0, 2**63)")
    return app_id, version


def check_transaction_id(txn_id: object) -> str:
    if not isinstance(txn_id, str):
        raise InvalidArgumentType(f"a transaction id must be a str, not {type(txn_id).__name__}")
    if TXN_ID_PATTERN.fullmatch(txn_id) is None:
        raise InvalidArgument(
            f"{txn_id!r} is not a transaction id: pass the `id` of a Transaction (32 hex digits)"
        )
    return txn_id


def check_transaction_config(
    commit_keys_max: object,
    txn_idle_s_max: object,
    txn_pending_max: object = TXN_PENDING_MAX_DEFAULT,
    txn_segments_max: object = TXN_SEGMENTS_MAX_DEFAULT,
    app_ids_max: object = APP_IDS_MAX_DEFAULT,
) -> None:
    counts = {
        "commit_keys_max": commit_keys_max,
        "txn_pending_max": txn_pending_max,
        "txn_segments_max": txn_segments_max,
        "app_ids_max": app_ids_max,
    }
    limits: dict[str, int] = {}
    for key, value in counts.items():
        if not is_int(value):
            raise InvalidArgumentType(f"{key} must be an int, not {type(value).__name__}")
        assert isinstance(value, int)
        if value < 1:
            raise InvalidArgument(f"{key}={value} must be 1 or more")
        limits[key] = value
    if limits["commit_keys_max"] > COMMIT_KEYS_MAX_LIMIT:
        raise InvalidArgument(
            f"commit_keys_max={commit_keys_max} must be in 1..{COMMIT_KEYS_MAX_LIMIT}"
        )
    taken = transaction_fields_bytes(**limits)
    if taken > TRANSACTION_FIELDS_BYTES_MAX:
        given = ", ".join(f"{key}={value}" for key, value in counts.items())
        raise InvalidArgument(
            f"{given}: at their bounds the transaction fields would take {taken} bytes of "
            f"the stream's document, over the {TRANSACTION_FIELDS_BYTES_MAX} it keeps for "
            f"them (a commit key takes {COMMIT_KEY_BYTES}, an app id {APP_ID_BYTES}, a "
            f"pending transaction {PENDING_TXN_BYTES}, a pending segment "
            f"{PENDING_SEGMENT_BYTES}): lower some of them"
        )
    if not isinstance(txn_idle_s_max, int | float) or isinstance(txn_idle_s_max, bool):
        raise InvalidArgumentType(
            f"txn_idle_s_max must be a number of seconds, not {type(txn_idle_s_max).__name__}"
        )
    if not (math.isfinite(txn_idle_s_max) and txn_idle_s_max > 0):
        raise InvalidArgument(f"txn_idle_s_max={txn_idle_s_max} must be a finite number above 0")


def transaction_fields_bytes(
    commit_keys_max: int, txn_pending_max: int, txn_segments_max: int, app_ids_max: int
) -> int:
    """The most the transaction fields take of the document under these limits."""
    return (
        commit_keys_max * COMMIT_KEY_BYTES
        + app_ids_max * APP_ID_BYTES
        + txn_pending_max * PENDING_TXN_BYTES
        + txn_segments_max * PENDING_SEGMENT_BYTES
    )


def decode_transaction_fields(raw: Any) -> dict[str, Any]:
    """The StreamDocument fields from a decoded document (a document written before
    transactions has no `app_versions`)."""
    return {
        "transactions": tuple(
            PendingTransaction(
                _str(txn_id),
                _int(created),
                _int(active),
                tuple(PendingSegment(_int(ledger), _int(ms)) for ledger, ms in segments),
            )
            for txn_id, created, active, segments in raw["transactions"]
        ),
        "commit_keys": tuple(
            CommitKey(_str(digest), _int(commit)) for digest, commit in raw["commit_keys"]
        ),
        "app_versions": tuple(
            AppVersion(_str(app), _int(version), _int(commit))
            for app, version, commit in raw.get("app_versions", [])
        ),
    }


def _int(value: Any) -> int:
    if not is_int(value):
        raise TypeError(f"{value!r} is not an int")
    return int(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a str")
    return value
