"""The stream document: what the metadata store keeps for a stream (space "streams",
named after it), and every change to it as a pure function returning a new, validated
document. No I/O: the writer, the stream and the readers do the reading and the
compare-and-set around these (docs/streams.md, docs/metadata.md "Streams").

A document lists the stream's visible segments in order, each a ledger with its
sequence number (the first half of a `Position`) and the commit number that made it
visible. `commit` goes up by one per visible change (a segment added, the stream
sealed). The live writer holds an epoch: taking over bumps it, and every change a
writer makes names the epoch it holds, so a fenced writer's change is refused.

Format version 1. Transactions (pending ones, commit keys, app versions) live in
fields of their own, decided in transaction_fields.py and transaction_changes.py; a
commit's segments come after the live writer's OPEN one when it is open. `cursors` is
present and must be empty; a reader refuses a document of a higher version instead of
rewriting it without what it does not know.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

from ledger.errors import InvalidArgument, InvalidArgumentType
from pora.client.replication.arguments import check_quorums, is_int
from pora.meta.errors import InvalidMetadata, MetadataRecordTooLarge
from pora.meta.records import RECORD_BYTES_MAX
from pora.streams.position import Position
from pora.streams.stream_attributes import check_attributes, decode_attributes
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
    check_transaction_fields,
    decode_transaction_fields,
    encode_transaction_fields,
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
#: the fields later versions fill; empty in version 1
_RESERVED = ("cursors",)


def check_stream_name(name: object) -> str:
    """A stream name: 1..128 characters of [A-Za-z0-9._-], not starting with '.'."""
    if not isinstance(name, str):
        raise InvalidArgumentType(f"a stream name must be a str, not {type(name).__name__}")
    if _STREAM_NAME.fullmatch(name) is None:
        raise InvalidArgument(
            f"{name!r} is not a stream name: use 1 to {STREAM_NAME_CHARS_MAX} characters of "
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


# -- the changes ----------------------------------------------------------------------


def new_stream(name: str, config: StreamConfig, now_ms: int) -> StreamDocument:
    return _checked(
        StreamDocument(
            name=check_stream_name(name),
            config=config,
            state=StreamState.ACTIVE,
            commit=0,
            segments=(),
            next_seq=0,
            writer_epoch=0,
            writer_segment=None,
            created_ms=now_ms,
        )
    )


def _check_writer(doc: StreamDocument, epoch: int) -> None:
    if doc.state is StreamState.SEALED:
        raise StreamChangeRefused(f"stream {doc.name!r} is sealed")
    if doc.writer_epoch != epoch:
        raise StreamChangeRefused(
            f"stream {doc.name!r}: writer epoch {epoch} is not the current one ({doc.writer_epoch})"
        )


def take_over(doc: StreamDocument) -> StreamDocument:
    """A new live writer: the epoch goes up (the earlier writer's changes are refused
    from now on). Its OPEN segment stays until `close_segment` fixes its end."""
    if doc.state is StreamState.SEALED:
        raise StreamChangeRefused(f"stream {doc.name!r} is sealed")
    return _checked(replace(doc, writer_epoch=doc.writer_epoch + 1))


def close_segment(
    doc: StreamDocument, epoch: int, last_entry_id: int, byte_length: int, now_ms: int = 0
) -> StreamDocument:
    """The writer's OPEN segment fixed at its last entry (a recovery's, or the
    writer's own last acknowledged one). Not a visible change: its entries were
    readable up to the LAC already. `now_ms` is its close time (0: not known)."""
    if doc.state is StreamState.ACTIVE:
        _check_writer(doc, epoch)
    current = doc.open_segment
    if current is None:
        raise StreamChangeRefused(f"stream {doc.name!r} has no open segment to close")
    closed = replace(
        current,
        state=SegmentState.CLOSED,
        last_entry_id=last_entry_id,
        byte_length=byte_length,
        closed_ms=now_ms,
    )
    segments = tuple(closed if s.seq == current.seq else s for s in doc.segments)
    return _checked(replace(doc, segments=segments, writer_segment=None))


def add_segment(doc: StreamDocument, epoch: int, ledger_id: int, now_ms: int) -> StreamDocument:
    """The writer's new OPEN segment, visible from the next commit number."""
    _check_writer(doc, epoch)
    if doc.writer_segment is not None:
        raise StreamChangeRefused(
            f"stream {doc.name!r}: segment {doc.writer_segment} is still open"
        )
    commit = doc.commit + 1
    segment = Segment(doc.next_seq, ledger_id, SegmentState.OPEN, commit, now_ms)
    return _checked(
        replace(
            doc,
            commit=commit,
            segments=(*doc.segments, segment),
            next_seq=doc.next_seq + 1,
            writer_segment=segment.seq,
        )
    )


def roll(
    doc: StreamDocument,
    epoch: int,
    last_entry_id: int,
    byte_length: int,
    next_ledger_id: int,
    now_ms: int,
) -> StreamDocument:
    """Rollover in one change: the writer's segment closed at its last entry and the
    next one added, OPEN."""
    closed = close_segment(doc, epoch, last_entry_id, byte_length, now_ms)
    return add_segment(closed, epoch, next_ledger_id, now_ms)


def seal(doc: StreamDocument) -> StreamDocument:
    """No writer may append again; the OPEN segment must be closed first."""
    if doc.state is StreamState.SEALED:
        return doc
    if doc.writer_segment is not None:
        raise StreamChangeRefused(
            f"stream {doc.name!r}: close segment {doc.writer_segment} before sealing"
        )
    return _checked(replace(doc, state=StreamState.SEALED, commit=doc.commit + 1))


def truncate(doc: StreamDocument, removed: tuple[Segment, ...]) -> StreamDocument:
    """The stream without `removed`: its leading held segments (consecutive from
    `doc.first_seq`, CLOSED). They leave the head; a page left with none of its
    segments held leaves the head's list (its document is deleted after). A visible
    change: the commit number goes up. retention.py decides which segments go."""
    if not removed:
        raise StreamChangeRefused(f"stream {doc.name!r}: a truncation removes some segment")
    seqs = [s.seq for s in removed]
    if seqs != list(range(doc.first_seq, doc.first_seq + len(seqs))):
        raise StreamChangeRefused(
            f"stream {doc.name!r}: truncation must remove the leading segments from "
            f"{doc.first_seq}, not {seqs[:3]}..."
        )
    if any(s.state is not SegmentState.CLOSED for s in removed):
        raise StreamChangeRefused(f"stream {doc.name!r}: the open segment is never truncated")
    first_held = seqs[-1] + 1
    return _checked(
        replace(
            doc,
            commit=doc.commit + 1,
            segments=tuple(s for s in doc.segments if s.seq >= first_held),
            pages=tuple(ref for ref in doc.pages if ref.last_seq >= first_held),
            first_held_seq=first_held,
            removed_last_entry_id=removed[-1].last_entry_id,
        )
    )


def page_out(
    doc: StreamDocument,
    head_segments_max: int | None = None,
    page_segments: int | None = None,
) -> tuple[SegmentPage, StreamDocument] | None:
    """When the head holds more than `head_segments_max` segments: its oldest
    `page_segments` (all CLOSED, else None: the live writer's OPEN segment is paged
    out after it closes) as a page, and the
    head without them, naming the page. The page is stored first, then the head by
    compare-and-set; a page whose head change failed is written again, identical.
    The limits default to HEAD_SEGMENTS_MAX and PAGE_SEGMENTS."""
    head_segments_max = HEAD_SEGMENTS_MAX if head_segments_max is None else head_segments_max
    page_segments = PAGE_SEGMENTS if page_segments is None else page_segments
    if len(doc.segments) <= head_segments_max:
        return None
    if not 0 < page_segments < len(doc.segments):
        raise StreamChangeRefused(f"a page of {page_segments} segments does not fit the head")
    moved = doc.segments[:page_segments]
    if any(s.state is SegmentState.OPEN for s in moved):
        # the live segment with many committed segments after it: page once it closes
        return None
    page = SegmentPage(doc.name, moved)
    ref = PageRef(moved[0].seq, moved[-1].seq)
    head = replace(doc, segments=doc.segments[page_segments:], pages=(*doc.pages, ref))
    return _checked_page(page), _checked(head)


def _checked_page(page: SegmentPage) -> SegmentPage:
    seqs = [s.seq for s in page.segments]
    if not seqs or seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        raise InvalidMetadata(
            f"segment page of {page.stream!r}: segments {seqs[:3]}... not consecutive"
        )
    if any(s.state is not SegmentState.CLOSED for s in page.segments):
        raise InvalidMetadata(f"segment page {page.name!r} holds a segment that is not CLOSED")
    return page


def _check_page_version(version: object) -> None:
    if version != STREAM_FORMAT_VERSION:
        raise InvalidMetadata(
            f"segment page format version {version!r} is not {STREAM_FORMAT_VERSION}: "
            "a newer Pora wrote it; upgrade this client"
        )


def encode_page(page: SegmentPage) -> bytes:
    data = {
        "format_version": STREAM_FORMAT_VERSION,
        "stream": page.stream,
        "segments": [_segment_row(s) for s in page.segments],
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def decode_page(data: bytes) -> SegmentPage:
    try:
        raw = json.loads(data)
        _check_page_version(raw["format_version"])
        page = SegmentPage(
            check_stream_name(raw["stream"]), tuple(_segment(item) for item in raw["segments"])
        )
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise InvalidMetadata(f"segment page is malformed: {error!r}") from error
    return _checked_page(page)


# -- validation and encoding ----------------------------------------------------------


def _checked(doc: StreamDocument) -> StreamDocument:
    """The document, if it keeps every rule; InvalidMetadata naming the first broken."""
    where = f"stream document {doc.name!r}"
    _check_pages(doc, where)
    seqs = [s.seq for s in doc.segments]
    if seqs and (seqs != list(range(seqs[0], seqs[0] + len(seqs))) or seqs[-1] >= doc.next_seq):
        raise InvalidMetadata(f"{where}: segment numbers {seqs} are not consecutive below next_seq")
    if not seqs and doc.next_seq < 0:
        raise InvalidMetadata(f"{where}: next_seq {doc.next_seq} is negative")
    commits = [s.commit for s in doc.segments]
    if commits != sorted(commits) or (commits and commits[-1] > doc.commit):
        raise InvalidMetadata(
            f"{where}: segment commits {commits} out of order or over {doc.commit}"
        )
    open_seqs = [s.seq for s in doc.segments if s.state is SegmentState.OPEN]
    expected_open = [] if doc.writer_segment is None else [doc.writer_segment]
    if open_seqs != expected_open:
        raise InvalidMetadata(
            f"{where}: open segments {open_seqs} are not the writer's ({doc.writer_segment})"
        )
    # the open segment is the last one but for the segments of transactions committed
    # while it is open (docs/streams.md, "Transactions and the live writer")
    if open_seqs and any(
        s.commit <= doc.segment(open_seqs[0]).commit for s in doc.segments if s.seq > open_seqs[0]
    ):
        raise InvalidMetadata(
            f"{where}: the open segment {open_seqs[0]} is followed by a segment it predates"
        )
    if doc.state is StreamState.SEALED and open_seqs:
        raise InvalidMetadata(f"{where}: sealed with segment {open_seqs[0]} open")
    _check_ends(doc.segments, where)
    if not 0 <= doc.first_held_seq <= doc.next_seq or doc.removed_last_entry_id < -1:
        raise InvalidMetadata(f"{where}: first held segment {doc.first_held_seq} out of range")
    if (seqs and seqs[0] < doc.first_held_seq) or (
        doc.pages and doc.pages[0].last_seq < doc.first_held_seq
    ):
        raise InvalidMetadata(f"{where}: lists segments below the first held one")
    if doc.writer_epoch < 0 or doc.commit < 0:
        raise InvalidMetadata(f"{where}: negative epoch or commit")
    check_transaction_fields(doc, where)
    check_attributes(doc.attributes, where)
    return doc


def _check_pages(doc: StreamDocument, where: str) -> None:
    """Pages consecutive, each first <= last, and the head starting after the last."""
    expected_first = None
    for ref in doc.pages:
        if ref.last_seq < ref.first_seq or ref.first_seq != (expected_first or ref.first_seq):
            raise InvalidMetadata(f"{where}: pages {doc.pages} are not consecutive")
        expected_first = ref.last_seq + 1
    head_first = doc.segments[0].seq if doc.segments else doc.next_seq
    if doc.pages and head_first != expected_first:
        raise InvalidMetadata(f"{where}: the head does not start where the pages end")


def _check_ends(segments: tuple[Segment, ...], where: str) -> None:
    for segment in segments:
        if segment.last_entry_id < -1 or segment.byte_length < 0:
            raise InvalidMetadata(f"{where}: segment {segment.seq} has a negative end")
        if segment.last_entry_id == -1 and segment.byte_length != 0:
            raise InvalidMetadata(f"{where}: segment {segment.seq} has bytes but no entries")


def encode_document(doc: StreamDocument) -> bytes:
    """Compact JSON, keys sorted; MetadataRecordTooLarge past what a metadata record
    holds (the head keeps it far below: its segments are paged out past
    HEAD_SEGMENTS_MAX, and a page takes some 15 bytes in it)."""
    config = doc.config
    data = {
        "format_version": STREAM_FORMAT_VERSION,
        "name": doc.name,
        "config": {
            "ensemble_size": config.ensemble_size,
            "write_quorum": config.write_quorum,
            "ack_quorum": config.ack_quorum,
            "segment_bytes_max": config.segment_bytes_max,
            "segment_age_s_max": config.segment_age_s_max,
            "retention_s": config.retention_s,
            "retention_bytes": config.retention_bytes,
            "retention_s_max": config.retention_s_max,
            "retention_bytes_max": config.retention_bytes_max,
            "commit_keys_max": config.commit_keys_max,
            "txn_idle_s_max": config.txn_idle_s_max,
            "txn_pending_max": config.txn_pending_max,
            "txn_segments_max": config.txn_segments_max,
            "app_ids_max": config.app_ids_max,
        },
        "state": doc.state.value,
        "commit": doc.commit,
        "segments": [_segment_row(s) for s in doc.segments],
        "pages": [[ref.first_seq, ref.last_seq] for ref in doc.pages],
        "next_seq": doc.next_seq,
        "writer": {"epoch": doc.writer_epoch, "segment": doc.writer_segment},
        "created_ms": doc.created_ms,
        "truncation": {
            "first_held_seq": doc.first_held_seq,
            "removed_last_entry_id": doc.removed_last_entry_id,
        },
        **{field: [] for field in _RESERVED},
        **encode_transaction_fields(doc),
        **({"attributes": dict(doc.attributes)} if doc.attributes else {}),
    }
    encoded = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    if len(encoded) > RECORD_BYTES_MAX:
        raise MetadataRecordTooLarge(
            f"stream document {doc.name!r}", len(encoded), RECORD_BYTES_MAX
        )
    return encoded


def decode_document(data: bytes) -> StreamDocument:
    """The document `encode_document` wrote; InvalidMetadata saying what is wrong."""
    try:
        raw = json.loads(data)
        _check_version(raw)
        config = raw["config"]
        truncation = _truncation(raw.get("truncation"))
        doc = StreamDocument(
            name=check_stream_name(raw["name"]),
            config=StreamConfig(
                **{key: config[key] for key in _CONFIG_KEYS},
                **{key: config.get(key) for key in _HARD_LIMIT_KEYS},
                **{key: config[key] for key in _TRANSACTION_CONFIG_KEYS if key in config},
            ),
            state=StreamState(raw["state"]),
            commit=_int(raw["commit"]),
            segments=tuple(_segment(item) for item in raw["segments"]),
            next_seq=_int(raw["next_seq"]),
            writer_epoch=_int(raw["writer"]["epoch"]),
            writer_segment=_optional_int(raw["writer"]["segment"]),
            created_ms=_int(raw["created_ms"]),
            pages=tuple(PageRef(_int(first), _int(last)) for first, last in raw["pages"]),
            first_held_seq=truncation["first_held_seq"],
            removed_last_entry_id=truncation["removed_last_entry_id"],
            **decode_transaction_fields(raw),
            attributes=decode_attributes(raw.get("attributes", {})),
        )
    except InvalidMetadata:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise InvalidMetadata(f"stream document is malformed: {error!r}") from error
    return _checked(doc)


def _check_version(raw: Any) -> None:
    version = raw["format_version"]
    if version != STREAM_FORMAT_VERSION:
        raise InvalidMetadata(
            f"stream document format version {version!r} is not {STREAM_FORMAT_VERSION}: "
            "a newer Pora wrote it; upgrade this client"
        )
    for field in _RESERVED:
        if raw[field] != []:
            raise InvalidMetadata(f"stream document field {field!r} must be empty in version 1")


#: absent from documents written before transactions: the defaults apply
_TRANSACTION_CONFIG_KEYS = (
    "commit_keys_max",
    "txn_idle_s_max",
    "txn_pending_max",
    "txn_segments_max",
    "app_ids_max",
)
_CONFIG_KEYS = (
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
    "segment_bytes_max",
    "segment_age_s_max",
    "retention_s",
    "retention_bytes",
)


#: config keys a document written before the hard limits lacks (None then)
_HARD_LIMIT_KEYS = ("retention_s_max", "retention_bytes_max")


def _truncation(raw: Any) -> dict[str, int]:
    """The truncation fields (absent from a document never truncated by a Pora that
    wrote them: nothing removed)."""
    if raw is None:
        return {"first_held_seq": 0, "removed_last_entry_id": -1}
    return {
        "first_held_seq": _int(raw["first_held_seq"]),
        "removed_last_entry_id": _int(raw["removed_last_entry_id"]),
    }


def _int(value: Any) -> int:  # shared with cursors.py
    if not is_int(value):
        raise TypeError(f"{value!r} is not an int")
    return int(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _segment_row(s: Segment) -> list[int | str]:
    return [
        s.seq,
        s.ledger_id,
        s.state.value,
        s.commit,
        s.created_ms,
        s.last_entry_id,
        s.byte_length,
        s.closed_ms,
    ]


def _segment(item: Any) -> Segment:
    # 7 fields: a row written before close times were kept (closed_ms not known)
    seq, ledger_id, state, commit, created_ms, last, length, *closed = item
    if len(closed) > 1:
        raise ValueError(f"a segment row has 7 or 8 fields, not {len(item)}")
    return Segment(
        _int(seq),
        _int(ledger_id),
        SegmentState(state),
        _int(commit),
        _int(created_ms),
        _int(last),
        _int(length),
        _int(closed[0]) if closed else 0,
    )
