"""The stream document: what the metadata store keeps for a stream (space "streams",
named after it), and every change to it as a pure function returning a new, validated
document. No I/O: the writer, the stream and the readers do the reading and the
compare-and-set around these (docs/streams.md, docs/metadata.md "Streams").

The document's types are in document_model.py, its rules and encoding in
document_codec.py; this module holds the changes and re-exports both.

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

from collections.abc import Mapping
from dataclasses import replace

from ledger.errors import InvalidArgument
from pora.streams.document_codec import (
    checked_document,
    checked_page,
    decode_document,
    decode_page,
    encode_document,
    encode_page,
)
from pora.streams.document_model import (
    HEAD_SEGMENTS_MAX,
    PAGE_SEGMENTS,
    PAGES_SPACE,
    SEGMENT_BYTES_MIN,
    STREAM_FORMAT_VERSION,
    STREAM_NAME_CHARS_MAX,
    STREAMS_SPACE,
    PageRef,
    Segment,
    SegmentPage,
    SegmentState,
    StreamChangeRefused,
    StreamConfig,
    StreamDocument,
    StreamState,
    check_stream_name,
    page_name,
    pending_segment_count,
)
from pora.streams.errors import AttributesChanged
from pora.streams.stream_attributes import (
    ATTRIBUTES_BYTES_MAX,
    ATTRIBUTES_MAX,
    attributes_bytes,
)

#: the names of the model and the codec, re-exported: this module is their face
__all__ = [
    "HEAD_SEGMENTS_MAX",
    "PAGES_SPACE",
    "PAGE_SEGMENTS",
    "SEGMENT_BYTES_MIN",
    "STREAMS_SPACE",
    "STREAM_FORMAT_VERSION",
    "STREAM_NAME_CHARS_MAX",
    "PageRef",
    "Segment",
    "SegmentPage",
    "SegmentState",
    "StreamChangeRefused",
    "StreamConfig",
    "StreamDocument",
    "StreamState",
    "add_segment",
    "change_attributes",
    "check_stream_name",
    "checked_document",
    "close_segment",
    "decode_document",
    "decode_page",
    "encode_document",
    "encode_page",
    "lose_segments",
    "mark_deleting",
    "new_stream",
    "page_name",
    "page_out",
    "pending_segment_count",
    "roll",
    "seal",
    "take_over",
    "truncate",
]


# -- the changes ----------------------------------------------------------------------


def new_stream(name: str, config: StreamConfig, now_ms: int) -> StreamDocument:
    return checked_document(
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
    return checked_document(replace(doc, writer_epoch=doc.writer_epoch + 1))


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
    return checked_document(replace(doc, segments=segments, writer_segment=None))


def lose_segments(
    doc: StreamDocument, epoch: int, seqs: tuple[int, ...], now_ms: int = 0
) -> StreamDocument:
    """The segments `seqs` marked LOST (their ledgers were deleted outside the stream,
    which is definitive: ledger ids are never reused): CLOSED, holding nothing. The
    writer's OPEN one among them is closed so; a seq no longer in the head (truncated
    meanwhile) or already LOST is left as it is. Not a visible change (what was
    readable there is gone already)."""
    if doc.state is StreamState.ACTIVE:
        _check_writer(doc, epoch)
    writer_segment = doc.writer_segment
    segments = []
    for segment in doc.segments:
        if segment.seq in seqs and not segment.lost:
            if segment.seq == writer_segment:
                writer_segment = None
            segments.append(
                replace(
                    segment,
                    state=SegmentState.CLOSED,
                    last_entry_id=-1,
                    byte_length=0,
                    closed_ms=segment.closed_ms or now_ms,
                    lost=True,
                )
            )
        else:
            segments.append(segment)
    return checked_document(replace(doc, segments=tuple(segments), writer_segment=writer_segment))


def add_segment(doc: StreamDocument, epoch: int, ledger_id: int, now_ms: int) -> StreamDocument:
    """The writer's new OPEN segment, visible from the next commit number."""
    _check_writer(doc, epoch)
    if doc.writer_segment is not None:
        raise StreamChangeRefused(
            f"stream {doc.name!r}: segment {doc.writer_segment} is still open"
        )
    commit = doc.commit + 1
    segment = Segment(doc.next_seq, ledger_id, SegmentState.OPEN, commit, now_ms)
    return checked_document(
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


def mark_deleting(doc: StreamDocument) -> StreamDocument:
    """The first step of a stream's delete: the stream is gone for every client from
    this change on (docs/streams.md, "Deleting a stream"). Not a visible change."""
    return checked_document(replace(doc, deleting=True))


def seal(doc: StreamDocument) -> StreamDocument:
    """No writer may append again; the OPEN segment must be closed first."""
    if doc.state is StreamState.SEALED:
        return doc
    if doc.writer_segment is not None:
        raise StreamChangeRefused(
            f"stream {doc.name!r}: close segment {doc.writer_segment} before sealing"
        )
    return checked_document(replace(doc, state=StreamState.SEALED, commit=doc.commit + 1))


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
    return checked_document(
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
    return checked_page(page), checked_document(head)


def change_attributes(
    doc: StreamDocument, changes: Mapping[str, str | None], expected: Mapping[str, str | None]
) -> StreamDocument | None:
    """The document with `changes` applied (None: the key removed), if every key of
    `expected` has the value given there (None: absent); AttributesChanged naming the
    first that does not. None when nothing would change."""
    current = dict(doc.attributes)
    for key, value in expected.items():
        if current.get(key) != value:
            raise AttributesChanged(doc.name, key, value, current.get(key))
    new = dict(current)
    for key, value in changes.items():
        if value is None:
            new.pop(key, None)
        else:
            new[key] = value
    if new == current:
        return None
    attributes = tuple(sorted(new.items()))
    if len(attributes) > ATTRIBUTES_MAX:
        raise InvalidArgument(
            f"stream {doc.name!r} would have {len(attributes)} attributes, over the "
            f"{ATTRIBUTES_MAX} it keeps"
        )
    size = attributes_bytes(attributes)
    if size > ATTRIBUTES_BYTES_MAX:
        raise InvalidArgument(
            f"stream {doc.name!r}: its attributes would take {size} bytes, over the "
            f"{ATTRIBUTES_BYTES_MAX} it keeps"
        )
    return checked_document(replace(doc, attributes=attributes))
