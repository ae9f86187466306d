"""The stream document's rules and its encoding: `checked_document` (every rule a
document keeps, checked after each change and after decoding), and the JSON of a
document and of a segment page (format version 1; docs/streams.md).
"""

from __future__ import annotations

import json
from typing import Any

from pora.client.replication.arguments import is_int
from pora.meta.errors import InvalidMetadata, MetadataRecordTooLarge
from pora.meta.records import RECORD_BYTES_MAX
from pora.streams.document_model import (
    STREAM_FORMAT_VERSION,
    PageRef,
    Segment,
    SegmentPage,
    SegmentState,
    StreamConfig,
    StreamDocument,
    StreamState,
    check_stream_name,
    pending_segment_count,
)
from pora.streams.stream_attributes import check_attributes, decode_attributes
from pora.streams.transaction_fields import (
    TXN_ID_PATTERN,
    decode_transaction_fields,
)

#: the fields later versions fill; empty in version 1
_RESERVED = ("cursors",)


def checked_document(doc: StreamDocument) -> StreamDocument:
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
        if segment.lost and (
            segment.state is not SegmentState.CLOSED
            or segment.last_entry_id != -1
            or segment.byte_length != 0
        ):
            raise InvalidMetadata(f"{where}: LOST segment {segment.seq} is not CLOSED and empty")
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
        **({"deleting": True} if doc.deleting else {}),
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
            commit=decoded_int(raw["commit"]),
            segments=tuple(_segment(item) for item in raw["segments"]),
            next_seq=decoded_int(raw["next_seq"]),
            writer_epoch=decoded_int(raw["writer"]["epoch"]),
            writer_segment=_optional_int(raw["writer"]["segment"]),
            created_ms=decoded_int(raw["created_ms"]),
            pages=tuple(
                PageRef(decoded_int(first), decoded_int(last)) for first, last in raw["pages"]
            ),
            first_held_seq=truncation["first_held_seq"],
            removed_last_entry_id=truncation["removed_last_entry_id"],
            **decode_transaction_fields(raw),
            attributes=decode_attributes(raw.get("attributes", {})),
            deleting=_deleting(raw.get("deleting", False)),
        )
    except InvalidMetadata:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise InvalidMetadata(f"stream document is malformed: {error!r}") from error
    return checked_document(doc)


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
        "first_held_seq": decoded_int(raw["first_held_seq"]),
        "removed_last_entry_id": decoded_int(raw["removed_last_entry_id"]),
    }


def _deleting(value: Any) -> bool:
    """The delete mark (absent from a document no delete has marked)."""
    if not isinstance(value, bool):
        raise TypeError(f"deleting is {value!r}, not true or false")
    return value


def decoded_int(value: Any) -> int:
    if not is_int(value):
        raise TypeError(f"{value!r} is not an int")
    return int(value)


def _optional_int(value: Any) -> int | None:
    return None if value is None else decoded_int(value)


def _segment_row(s: Segment) -> list[int | str]:
    return [
        s.seq,
        s.ledger_id,
        _LOST if s.lost else s.state.value,
        s.commit,
        s.created_ms,
        s.last_entry_id,
        s.byte_length,
        s.closed_ms,
    ]


#: a segment row's state for a LOST segment (a CLOSED one whose ledger was deleted
#: outside the stream); a client without it refuses the row instead of reading it empty
_LOST = "LOST"


def _segment(item: Any) -> Segment:
    # 7 fields: a row written before close times were kept (closed_ms not known)
    seq, ledger_id, state, commit, created_ms, last, length, *closed = item
    if len(closed) > 1:
        raise ValueError(f"a segment row has 7 or 8 fields, not {len(item)}")
    return Segment(
        decoded_int(seq),
        decoded_int(ledger_id),
        SegmentState.CLOSED if state == _LOST else SegmentState(state),
        decoded_int(commit),
        decoded_int(created_ms),
        decoded_int(last),
        decoded_int(length),
        decoded_int(closed[0]) if closed else 0,
        lost=state == _LOST,
    )


def check_transaction_fields(doc: StreamDocument, where: str) -> None:
    """The transaction fields keep their rules; InvalidMetadata naming the first broken."""
    ids = [txn.id for txn in doc.transactions]
    if len(set(ids)) != len(ids) or len(ids) > doc.config.txn_pending_max:
        raise InvalidMetadata(f"{where}: pending transaction ids repeat or are too many")
    if any(TXN_ID_PATTERN.fullmatch(txn.id) is None for txn in doc.transactions):
        raise InvalidMetadata(f"{where}: a pending transaction id is malformed")
    if pending_segment_count(doc) > doc.config.txn_segments_max:
        raise InvalidMetadata(
            f"{where}: over txn_segments_max={doc.config.txn_segments_max} pending segments"
        )
    commits = [key.commit for key in doc.commit_keys]
    if commits != sorted(commits) or any(c > doc.commit for c in commits):
        raise InvalidMetadata(f"{where}: commit keys out of order or past commit {doc.commit}")
    if len(doc.commit_keys) > doc.config.commit_keys_max:
        raise InvalidMetadata(f"{where}: more commit keys than commit_keys_max")
    apps = [app.app_id for app in doc.app_versions]
    if apps != sorted(set(apps)) or len(apps) > doc.config.app_ids_max:
        raise InvalidMetadata(f"{where}: app versions not by app id, repeated or too many")


def encode_transaction_fields(doc: StreamDocument) -> dict[str, Any]:
    return {
        "transactions": [
            [
                txn.id,
                txn.created_ms,
                txn.active_ms,
                [[s.ledger_id, s.created_ms] for s in txn.segments],
            ]
            for txn in doc.transactions
        ],
        "commit_keys": [[key.digest, key.commit] for key in doc.commit_keys],
        "app_versions": [[app.app_id, app.version, app.commit] for app in doc.app_versions],
    }


def checked_page(page: SegmentPage) -> SegmentPage:
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
    return checked_page(page)
