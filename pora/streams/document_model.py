"""The stream document's model: what the metadata store keeps for a stream (space
"streams", named after it) as typed, frozen values, and the limits on them.

document.py holds the changes to a document and is the face of the three modules
(it re-exports this one's names); document_codec.py checks a document's rules and
encodes it. This module is the bottom of the three: it knows neither.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass

from ledger.errors import InvalidArgument, InvalidArgumentType
from pora.client.replication.arguments import check_quorums, is_int
from pora.meta.errors import InvalidMetadata
from pora.streams.position import Position
from pora.streams.transaction_fields import (
    APP_IDS_MAX_DEFAULT,
    COMMIT_KEYS_MAX_DEFAULT,
    TXN_IDLE_S_MAX_DEFAULT,
    TXN_PENDING_MAX_DEFAULT,
    TXN_SEGMENTS_MAX_DEFAULT,
    AppVersion,
    CommitKey,
    PendingTransaction,
    check_transaction_config,
)

STREAM_FORMAT_VERSION = 1
#: the metadata store's space for stream documents
STREAMS_SPACE = "streams"
#: a segment rolls at no less than this (tests roll often; real streams roll at MiBs)
SEGMENT_BYTES_MIN = 64 * 1024
STREAM_NAME_CHARS_MAX = 128
_STREAM_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
#: the metadata store's space for segment pages (named "STREAM/FIRST_SEQ")
PAGES_SPACE = "stream-pages"
#: the head keeps at most this many segments before the oldest are paged out
HEAD_SEGMENTS_MAX = 1000
#: segments per page (a page of CLOSED segments takes some 35 KB)
PAGE_SEGMENTS = 500


def check_stream_name(name: object, what: str = "stream name") -> str:
    """A stream name (or a cursor's, `what` saying which the error names): 1..128
    characters of [A-Za-z0-9._-], not starting with '.'."""
    if not isinstance(name, str):
        raise InvalidArgumentType(f"a {what} must be a str, not {type(name).__name__}")
    if _STREAM_NAME.fullmatch(name) is None:
        raise InvalidArgument(
            f"{name!r} is not a {what}: use 1 to {STREAM_NAME_CHARS_MAX} characters of "
            "A-Z a-z 0-9 . _ - not starting with '.'"
        )
    return name


class StreamState(enum.Enum):
    ACTIVE = "ACTIVE"
    SEALED = "SEALED"


class SegmentState(enum.Enum):
    OPEN = "OPEN"  # the live writer writes it: readers stop at its ledger's LAC
    CLOSED = "CLOSED"  # fixed at `last_entry_id` and `byte_length`


@dataclass(frozen=True)
class StreamConfig:
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    segment_bytes_max: int = 256 << 20
    segment_age_s_max: float = 3600
    retention_s: float | None = None
    retention_bytes: int | None = None
    #: the hard limits: past them `trim` removes segments even when a cursor still
    #: needs them (that cursor's next read raises EntriesTruncated); None: no limit
    retention_s_max: float | None = None
    retention_bytes_max: int | None = None
    #: transactions: commit keys kept (oldest out first), and the idle time after
    #: which `collect_abandoned_transactions` may remove a pending transaction
    commit_keys_max: int = COMMIT_KEYS_MAX_DEFAULT
    txn_idle_s_max: float = TXN_IDLE_S_MAX_DEFAULT
    #: the most pending transactions, pending segments (all of them together) and app
    #: ids the document holds; together with commit_keys_max within what the document
    #: keeps for them (check_transaction_config)
    txn_pending_max: int = TXN_PENDING_MAX_DEFAULT
    txn_segments_max: int = TXN_SEGMENTS_MAX_DEFAULT
    app_ids_max: int = APP_IDS_MAX_DEFAULT

    def __post_init__(self) -> None:
        check_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        check_transaction_config(
            self.commit_keys_max,
            self.txn_idle_s_max,
            self.txn_pending_max,
            self.txn_segments_max,
            self.app_ids_max,
        )
        if not is_int(self.segment_bytes_max):
            raise InvalidArgumentType(
                f"segment_bytes_max must be an int, not {type(self.segment_bytes_max).__name__}"
            )
        if self.segment_bytes_max < SEGMENT_BYTES_MIN:
            raise InvalidArgument(
                f"segment_bytes_max={self.segment_bytes_max} is under the minimum of "
                f"{SEGMENT_BYTES_MIN} (64 KiB)"
            )
        _check_positive("segment_age_s_max", self.segment_age_s_max)
        for name in ("retention_s", "retention_s_max"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        for name in ("retention_bytes", "retention_bytes_max"):
            _check_bytes_limit(name, getattr(self, name))


def _check_bytes_limit(name: str, value: object) -> None:
    if value is None:
        return
    if not is_int(value):
        raise InvalidArgumentType(f"{name} must be an int or None, not {type(value).__name__}")
    assert isinstance(value, int)
    if value <= 0:
        raise InvalidArgument(f"{name}={value} must be above 0")


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidArgumentType(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise InvalidArgument(f"{name}={value} must be a finite number above 0")


@dataclass(frozen=True)
class Segment:
    seq: int
    ledger_id: int
    state: SegmentState
    #: the commit that made it visible
    commit: int
    created_ms: int
    #: CLOSED only: its last entry (-1: none) and the bytes of its payloads
    last_entry_id: int = -1
    byte_length: int = 0
    #: CLOSED only: when it was closed (wall clock, ms), for age retention; 0: not
    #: known (a segment closed before close times were kept: age never removes it)
    closed_ms: int = 0
    #: LOST: CLOSED, but its ledger was deleted outside the stream, so its entries
    #: are gone (last_entry_id -1, byte_length 0); readers raise EntriesLost there
    lost: bool = False


@dataclass(frozen=True)
class PageRef:
    """The head's entry for a page of CLOSED segments first_seq..last_seq."""

    first_seq: int
    last_seq: int


@dataclass(frozen=True)
class SegmentPage:
    """A document of older CLOSED segments, never changed once written."""

    stream: str
    segments: tuple[Segment, ...]

    @property
    def name(self) -> str:
        return page_name(self.stream, self.segments[0].seq)


def page_name(stream: str, first_seq: int) -> str:
    return f"{stream}/{first_seq}"


@dataclass(frozen=True)
class StreamDocument:
    name: str
    config: StreamConfig
    state: StreamState
    commit: int
    #: the recent visible segments, by increasing seq (consecutive numbers); the
    #: older ones are in pages
    segments: tuple[Segment, ...]
    #: the seq the next segment gets (segments removed later do not give theirs back)
    next_seq: int
    #: bumped by each writer that takes over; 0: no writer ever opened
    writer_epoch: int
    #: the seq of the live writer's OPEN segment, None when it has none
    writer_segment: int | None
    created_ms: int
    #: the pages of older segments, oldest first, consecutive, up to the head's first
    pages: tuple[PageRef, ...] = ()
    #: truncation (retention.py): segments below `first_held_seq` were removed; the
    #: last of them ended at `removed_last_entry_id` (-1: none removed or it was
    #: empty), so a position just past it is not a removed one
    first_held_seq: int = 0
    removed_last_entry_id: int = -1
    #: transactions (transaction_fields.py, transaction_changes.py): the pending ones by
    #: creation, the recorded commit keys oldest first, the app versions by app id
    transactions: tuple[PendingTransaction, ...] = ()
    commit_keys: tuple[CommitKey, ...] = ()
    app_versions: tuple[AppVersion, ...] = ()
    #: the application's own (key, value) strings, by key (stream_attributes.py):
    #: what a writer of the stream records for its readers, a table schema say
    attributes: tuple[tuple[str, str], ...] = ()
    #: set by the first step of `delete_stream` (docs/streams.md, "Deleting a
    #: stream"): every client then takes the stream as gone
    deleting: bool = False

    @property
    def head_first_seq(self) -> int:
        """The seq of the head's first segment (next_seq when it has none)."""
        if self.segments:
            return self.segments[0].seq
        return self.pages[-1].last_seq + 1 if self.pages else self.next_seq

    @property
    def first_seq(self) -> int:
        """The seq of the stream's first segment still held, paged or not (a page may
        start below it: a truncation keeps a page some of whose segments it removed)."""
        listed = self.pages[0].first_seq if self.pages else self.head_first_seq
        return max(listed, self.first_held_seq)

    @property
    def first_held(self) -> Position:
        """The first position the stream still holds."""
        return Position(self.first_seq, 0)

    def is_removed(self, position: Position) -> bool:
        """Whether `position` names an entry truncation removed (a position just past
        the last removed segment's end is the first held one, not a removed one)."""
        if position.segment >= self.first_held_seq:
            return False
        if position.segment == self.first_held_seq - 1:
            return position.entry <= self.removed_last_entry_id
        return True

    def segment(self, seq: int) -> Segment:
        """A segment of the head (InvalidMetadata for a paged one or none)."""
        index = seq - self.head_first_seq
        if not 0 <= index < len(self.segments):
            raise InvalidMetadata(f"stream {self.name!r} has no segment {seq}")
        return self.segments[index]

    @property
    def open_segment(self) -> Segment | None:
        if self.writer_segment is None:
            return None
        return self.segment(self.writer_segment)


class StreamChangeRefused(InvalidMetadata):
    """A change does not apply to the document as it is (a bug, or a document another
    client changed without the rules); says which rule."""


def pending_segment_count(doc: StreamDocument) -> int:
    return sum(len(txn.segments) for txn in doc.transactions)
