"""The transaction changes to the stream document, without I/O: commit keys kept
oldest-out at commit_keys_max, app versions one per app id, a commit after an OPEN
segment, and the encoding round trip."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ledger.errors import InvalidArgument, InvalidArgumentType
from pora.meta.records import RECORD_BYTES_MAX
from pora.streams.document import (
    PageRef,
    Segment,
    SegmentState,
    StreamChangeRefused,
    StreamConfig,
    add_segment,
    close_segment,
    decode_document,
    encode_document,
    new_stream,
    page_out,
    take_over,
)
from pora.streams.errors import TransactionAborted
from pora.streams.stream_attributes import ATTRIBUTES_BYTES_MAX, attributes_bytes
from pora.streams.transaction_changes import (
    abandoned_transactions,
    add_transaction_segment,
    begin_transaction,
    commit_transaction,
    prior_commit,
    remove_transaction,
)
from pora.streams.transaction_fields import (
    APP_ID_BYTES,
    COMMIT_KEY_BYTES,
    COMMIT_KEYS_MAX_LIMIT,
    PENDING_SEGMENT_BYTES,
    PENDING_TXN_BYTES,
    TRANSACTION_FIELDS_BYTES_MAX,
    AppVersion,
    CommitKey,
    PendingSegment,
    PendingTransaction,
    commit_key_digest,
)

T1, T2 = "1" * 32, "2" * 32


def test_keys_are_kept_oldest_out_and_round_trip() -> None:
    doc = new_stream("s", StreamConfig(commit_keys_max=2), 0)
    for number, key in enumerate(["a", "b", "c"], start=1):
        doc = begin_transaction(doc, T1, number)
        doc = add_transaction_segment(doc, T1, 100 + number, number)
        doc = commit_transaction(doc, T1, [(100 + number, 0, 1)], commit_key_digest(key), None, 9)
        assert doc.commit == number
    assert prior_commit(doc, commit_key_digest("a"), None) is None  # out: oldest first
    assert prior_commit(doc, commit_key_digest("b"), None) == 2
    assert prior_commit(doc, commit_key_digest("c"), None) == 3
    assert decode_document(encode_document(doc)) == doc


def test_app_versions_and_refusals() -> None:
    doc = begin_transaction(new_stream("s", StreamConfig(), 0), T1, 0)
    doc = begin_transaction(doc, T2, 0)
    with pytest.raises(StreamChangeRefused, match="each of its segments once"):
        commit_transaction(doc, T1, [(5, 0, 1)], None, None, 0)
    doc = commit_transaction(doc, T1, [], None, ("app", 7), 0)
    assert prior_commit(doc, None, ("app", 7)) == 1
    assert prior_commit(doc, None, ("app", 8)) is None
    with pytest.raises(StreamChangeRefused, match="applied already"):
        commit_transaction(doc, T2, [], None, ("app", 6), 0)
    with pytest.raises(TransactionAborted):
        add_transaction_segment(doc, T1, 9, 0)
    assert abandoned_transactions(doc, idle_ms=10, now_ms=10) == [T2]
    assert abandoned_transactions(doc, idle_ms=11, now_ms=10) == []
    assert remove_transaction(remove_transaction(doc, T2), T2).transactions == ()
    assert decode_document(encode_document(doc)) == doc


def test_a_commit_after_the_open_segment_keeps_position_order() -> None:
    doc = take_over(new_stream("s", StreamConfig(), 0))
    doc = add_segment(doc, 1, 10, 0)  # the live writer's, OPEN, seq 0
    doc = begin_transaction(doc, T1, 0)
    doc = add_transaction_segment(doc, T1, 20, 0)
    doc = commit_transaction(doc, T1, [(20, 4, 50)], None, None, 0)
    assert [(s.seq, s.state, s.commit) for s in doc.segments] == [
        (0, SegmentState.OPEN, 1),
        (1, SegmentState.CLOSED, 2),
    ]
    assert doc.open_segment is not None and doc.open_segment.seq == 0
    assert page_out(doc, head_segments_max=1, page_segments=1) is None  # not while OPEN
    doc = add_segment(close_segment(doc, 1, 3, 9), 1, 30, 0)
    assert [(s.seq, s.commit) for s in doc.segments] == [(0, 1), (1, 2), (2, 3)]
    assert decode_document(encode_document(doc)) == doc


def _corner(key: str) -> StreamConfig:
    """The limit `key` as high as the document's budget lets it be, the others at 1
    (commit_keys_max stays at its own bound)."""
    others = {name: 1 for name in _LIMIT_COSTS if name != key}
    spare = TRANSACTION_FIELDS_BYTES_MAX - sum(_LIMIT_COSTS[name] for name in others)
    top = spare // _LIMIT_COSTS[key]
    if key == "commit_keys_max":
        top = min(top, COMMIT_KEYS_MAX_LIMIT)
    return StreamConfig(**others, **{key: top})


_LIMIT_COSTS = {
    "commit_keys_max": COMMIT_KEY_BYTES,
    "app_ids_max": APP_ID_BYTES,
    "txn_pending_max": PENDING_TXN_BYTES,
    "txn_segments_max": PENDING_SEGMENT_BYTES,
}


@pytest.mark.parametrize(
    "config",
    [StreamConfig(), *(_corner(key) for key in _LIMIT_COSTS)],
    ids=["defaults", *(f"most-{key}" for key in _LIMIT_COSTS)],
)
def test_the_document_at_every_bound_fits_a_metadata_record(config: StreamConfig) -> None:
    """1,000 head segments and 200 pages (a stream of 100,000 segments), the commit
    keys, pending transactions and their segments, and app ids (of 128 characters) each
    at the config's limit, attributes at their byte bound: all large numbers, under a
    metadata record's 1 MiB; at the defaults (10,000 commit keys, 500 pending
    transactions holding 3,000 segments, 1,000 app ids) and with each limit as high as
    the budget the config is checked against lets it be."""
    big = 2**62
    segments = tuple(
        Segment(99_000 + k, big + k, SegmentState.CLOSED, big, big, big, big) for k in range(1000)
    )
    pages = tuple(PageRef(k * 500, k * 500 + 499) for k in range(198))
    per_txn, extra = divmod(config.txn_segments_max, config.txn_pending_max)
    transactions = tuple(
        PendingTransaction(
            f"{k:032x}",
            big,
            big,
            tuple(PendingSegment(big + j, big) for j in range(per_txn + (k < extra))),
        )
        for k in range(config.txn_pending_max)
    )
    doc = replace(
        new_stream("s" * 128, config, big),
        commit=big + 10_000,
        segments=segments,
        pages=pages,
        next_seq=100_000,
        transactions=transactions,
        commit_keys=tuple(
            CommitKey(commit_key_digest(str(k)), big + k) for k in range(config.commit_keys_max)
        ),
        app_versions=tuple(
            AppVersion(f"{k:06d}" + "a" * 122, big, big) for k in range(config.app_ids_max)
        ),
        attributes=(("schema", "x" * (ATTRIBUTES_BYTES_MAX - len('{"schema":""}'))),),
    )
    assert attributes_bytes(doc.attributes) == ATTRIBUTES_BYTES_MAX
    assert sum(len(t.segments) for t in transactions) == config.txn_segments_max
    size = len(encode_document(doc))
    assert size < RECORD_BYTES_MAX, size
    assert decode_document(encode_document(doc)) == doc


def test_the_limits_are_config_and_their_refusals_name_the_key() -> None:
    config = StreamConfig(txn_pending_max=2, txn_segments_max=3, app_ids_max=1)
    doc = new_stream("s", config, 0)
    assert decode_document(encode_document(doc)).config == config
    doc = begin_transaction(begin_transaction(doc, T1, 0), T2, 0)
    with pytest.raises(StreamChangeRefused, match="txn_pending_max=2"):
        begin_transaction(doc, "3" * 32, 0)
    for ledger_id in (1, 2, 3):
        doc = add_transaction_segment(doc, T1, ledger_id, 0)
    with pytest.raises(StreamChangeRefused, match="txn_segments_max=3"):
        add_transaction_segment(doc, T2, 4, 0)
    doc = commit_transaction(doc, T1, [(1, 0, 1), (2, 0, 1), (3, 0, 1)], None, ("a", 1), 0)
    with pytest.raises(StreamChangeRefused, match="app_ids_max=1"):
        commit_transaction(doc, T2, [], None, ("b", 1), 0)
    assert commit_transaction(doc, T2, [], None, ("a", 2), 0).commit == 2


def test_limits_past_the_document_budget_are_refused_naming_them() -> None:
    with pytest.raises(InvalidArgument, match=r"txn_segments_max=20000.*lower some of them"):
        StreamConfig(txn_segments_max=20_000)
    with pytest.raises(InvalidArgument, match="app_ids_max=0 must be 1 or more"):
        StreamConfig(app_ids_max=0)
    with pytest.raises(InvalidArgumentType, match="txn_pending_max must be an int"):
        StreamConfig(txn_pending_max=1.5)  # type: ignore[arg-type]
    assert StreamConfig(commit_keys_max=1000, txn_segments_max=10_000).txn_segments_max == 10_000
