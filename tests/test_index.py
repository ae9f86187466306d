"""The LevelDB index on a real DB: positions, metadata, atomic flushes, deletes that
stay inside their ledger, reopening, locking."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import plyvel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.index import SYNC_MARKER_NAME, Index, IndexOpenError
from ledger.state import NO_ENTRY, LedgerMeta, LedgerState

MAX_ID = 2**63 - 1


@pytest.fixture
def index_path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "index"


@pytest.fixture
def index(index_path: Path) -> Iterator[Index]:
    with Index(index_path, cache_bytes=1 << 20) as opened:
        yield opened


def positions_for(count: int, first: int = 0, base: int = 512) -> list[tuple[int, int, int]]:
    return [(entry_id, base + entry_id * 100, 100) for entry_id in range(first, first + count)]


def meta_for(ledger_id: int, last_entry_id: int = NO_ENTRY, log_end: int = 0) -> LedgerMeta:
    return LedgerMeta(
        ledger_id=ledger_id,
        last_entry_id=last_entry_id,
        first_entry_id=0 if last_entry_id >= 0 else NO_ENTRY,
        entry_count=last_entry_id + 1,
        log_end=log_end,
        durable_seq=last_entry_id * 10,
        created_ms=1_700_000_000_000 + ledger_id,
    )


def raw_keys(path: Path) -> list[bytes]:
    with plyvel.DB(str(path)) as db:
        return [key for key, _ in db.iterator()]


# --- positions ---------------------------------------------------------------------------


def test_positions_round_trip(index: Index) -> None:
    positions = [(0, 512, 30), (1, 542, 2**32 - 1), (2, 2**64 - 1, 24)]
    index.apply_flush(5, positions, meta_for(5, 2))
    for entry_id, offset, record_length in positions:
        assert index.get_position(5, entry_id) == (offset, record_length)
    assert index.get_position(5, 3) is None
    assert index.get_position(6, 0) is None


def test_keys_are_big_endian_ledger_then_last_entry_of_each_run(
    index: Index, index_path: Path
) -> None:
    index.apply_flush(1, [(256, 512, 30), (1, 542, 30)], meta_for(1, 256))  # two runs
    index.apply_flush(256, [(0, 512, 30)], meta_for(256, 0))
    index.apply_flush(2, positions_for(100), meta_for(2, 99))  # back to back: one run
    index.close()
    with plyvel.DB(str(index_path)) as db:
        runs = [(key, value) for key, value in db.iterator(prefix=b"r")]
    assert [key for key, _ in runs] == [
        b"r" + (1).to_bytes(8, "big") + (1).to_bytes(8, "big"),
        b"r" + (1).to_bytes(8, "big") + (256).to_bytes(8, "big"),
        b"r" + (2).to_bytes(8, "big") + (99).to_bytes(8, "big"),
        b"r" + (256).to_bytes(8, "big") + (0).to_bytes(8, "big"),
    ]
    # a run's value: its first offset (u64 BE), then each record's end after it (u32 LE)
    assert runs[1][1] == (512).to_bytes(8, "big") + (30).to_bytes(4, "little")
    hundred = runs[2][1]
    assert hundred[:8] == (512).to_bytes(8, "big")
    assert [int.from_bytes(hundred[8 + 4 * i : 12 + 4 * i], "little") for i in range(100)] == [
        100 * (i + 1) for i in range(100)
    ]


position_lists = st.lists(
    st.tuples(
        st.integers(0, 40),  # entry ids: small, so flushes overlap and leave gaps
        st.integers(0, 2**40),
        st.integers(0, 5000),
    ),
    max_size=30,
)


#: what a flush writes: consecutive entries, records back to back
back_to_back = st.builds(positions_for, st.integers(1, 10), st.integers(0, 40))


@pytest.mark.slow
@given(flushes=st.lists(st.one_of(position_lists, back_to_back), max_size=8))
def test_positions_behave_like_a_map_whatever_the_runs(
    tmp_path_factory: pytest.TempPathFactory, flushes: list[list[tuple[int, int, int]]]
) -> None:
    """Runs are an encoding: every lookup answers what one put per entry would."""
    model: dict[int, tuple[int, int]] = {}
    with Index(tmp_path_factory.mktemp("runs") / "index", cache_bytes=1 << 20) as index:
        for positions in flushes:
            index.apply_flush(7, positions, meta_for(7))
            for entry_id, offset, length in positions:
                model[entry_id] = (offset, length)
            for entry_id in range(45):
                assert index.get_position(7, entry_id) == model.get(entry_id)
            expected = [(e, *model[e]) for e in sorted(model)]
            assert list(index.iter_positions(7)) == expected
            assert list(index.iter_positions(7, 10, 20)) == [
                p for p in expected if 10 <= p[0] <= 20
            ]
            assert index.count_positions(7) == len(model)
        assert index.get_position(6, 0) is None
        assert index.get_position(8, 0) is None


@given(
    records=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 300)), max_size=30)
    | st.builds(lambda n, first: [(first + i, 100 + i) for i in range(n)],
                st.integers(1, 30), st.integers(0, 40)),
    offset=st.integers(512, 2**40),
)  # fmt: skip
@pytest.mark.slow
def test_back_to_back_records_index_as_their_positions_would(
    tmp_path_factory: pytest.TempPathFactory, records: list[tuple[int, int]], offset: int
) -> None:
    """A flush's columns (ids, one offset, lengths) give what the positions would:
    the consecutive case packed at once, anything else (gaps, repeats, disorder) too."""
    entry_ids = [entry_id for entry_id, _ in records]
    lengths = [length for _, length in records]
    starts = [offset + sum(lengths[:i]) for i in range(len(lengths))]
    with Index(tmp_path_factory.mktemp("columns") / "index", cache_bytes=1 << 20) as index:
        index.apply_flush(7, list(zip(entry_ids, starts, lengths, strict=True)), meta_for(7))
        index.apply_back_to_back(8, entry_ids, offset, lengths, meta_for(8))
        assert list(index.iter_positions(8)) == list(index.iter_positions(7))
        assert index.get_meta(8) == meta_for(8)
        for entry_id in set(entry_ids):
            assert index.get_position(8, entry_id) == index.get_position(7, entry_id)


def test_back_to_back_needs_a_length_per_id(index: Index) -> None:
    with pytest.raises(ValueError, match="3 entry ids for 2 record lengths"):
        index.apply_back_to_back(1, [0, 1, 2], 512, [10, 10], meta_for(1))
    assert index.get_meta(1) is None  # nothing written


def test_apply_flush_installs_positions_and_meta_together(index: Index) -> None:
    meta = meta_for(9, 99, log_end=512 + 100 * 100)
    index.apply_flush(9, positions_for(100), meta)
    assert index.get_meta(9) == meta
    assert list(index.iter_positions(9)) == positions_for(100)


def test_apply_flush_is_all_or_nothing(index: Index) -> None:
    index.apply_flush(9, positions_for(10), meta_for(9, 9))
    bad = [*positions_for(5, first=10), (-1, 0, 0), *positions_for(5, first=16)]
    with pytest.raises(ValueError, match=r"entry id -1 is not in 0\.\.2\*\*63-1"):
        index.apply_flush(9, bad, meta_for(9, 20))
    # neither the positions before the bad one nor the metadata were written
    assert index.count_positions(9) == 10
    assert index.get_position(9, 10) is None
    assert index.get_meta(9) == meta_for(9, 9)


def test_positions_out_of_range_are_refused_by_name(index: Index) -> None:
    for bad in ([(0, -1, 10), (1, 9, 10)], [(0, 2**64, 10)], [(0, 512, -3)], [(0, 512, 2**32)]):
        with pytest.raises(ValueError, match=r"entry 0: position \(.*\) is out of range"):
            index.apply_flush(1, bad, meta_for(1, 1))
    assert index.count_positions(1) == 0
    assert index.get_meta(1) is None


def test_apply_flush_refuses_another_ledgers_meta(index: Index) -> None:
    with pytest.raises(ValueError, match="metadata of ledger 2 given for ledger 1"):
        index.apply_flush(1, positions_for(1), meta_for(2))
    assert index.get_position(1, 0) is None


def test_apply_flush_with_no_positions_writes_meta(index: Index) -> None:
    index.apply_flush(4, [], meta_for(4))
    assert index.get_meta(4) == meta_for(4)
    assert index.count_positions(4) == 0


def test_iter_positions_bounds(index: Index) -> None:
    index.apply_flush(3, positions_for(10), meta_for(3, 9))
    index.apply_flush(2, positions_for(3), meta_for(2, 2))
    index.apply_flush(4, positions_for(3), meta_for(4, 2))

    def ids(from_entry: int = 0, to_entry: int | None = None) -> list[int]:
        return [entry_id for entry_id, _, _ in index.iter_positions(3, from_entry, to_entry)]

    assert ids() == list(range(10))
    assert ids(3) == list(range(3, 10))
    assert ids(3, 5) == [3, 4, 5]  # to_entry inclusive
    assert ids(5, 5) == [5]
    assert ids(6, 5) == []
    assert ids(0, MAX_ID) == list(range(10))
    assert ids(10) == []
    assert list(index.iter_positions(5)) == []


def test_iter_positions_at_the_largest_ids(index: Index) -> None:
    top = [(MAX_ID - 1, 512, 24), (MAX_ID, 536, 24)]
    index.apply_flush(MAX_ID, top, meta_for(MAX_ID))
    assert list(index.iter_positions(MAX_ID)) == top
    assert list(index.iter_positions(MAX_ID, MAX_ID, MAX_ID)) == top[1:]


def test_count_positions(index: Index) -> None:
    index.apply_flush(1, positions_for(37), meta_for(1, 36))
    index.apply_flush(2, positions_for(5), meta_for(2, 4))
    assert index.count_positions(1) == 37
    assert index.count_positions(2) == 5
    assert index.count_positions(3) == 0


def test_ids_outside_the_range_are_refused(index: Index) -> None:
    with pytest.raises(ValueError, match="ledger id -1"):
        index.get_position(-1, 0)
    with pytest.raises(ValueError, match="entry id 9223372036854775808"):
        index.get_position(0, 2**63)
    with pytest.raises(ValueError, match="from_entry -2"):
        index.iter_positions(0, -2)  # checked at the call, not at the first next()


# --- metadata ----------------------------------------------------------------------------


def test_put_and_get_meta(index: Index) -> None:
    assert index.get_meta(1) is None
    meta = LedgerMeta(ledger_id=1, state=LedgerState.CLOSED, fenced=True, sealed_last_entry_id=4)
    index.put_meta(meta)
    assert index.get_meta(1) == meta


def test_load_all_meta_over_10000_ledgers(index: Index, capsys: pytest.CaptureFixture[str]) -> None:
    ledger_ids = [ledger_id * 7919 for ledger_id in range(10_000)]
    for ledger_id in ledger_ids:
        index.put_meta(meta_for(ledger_id, ledger_id % 50))
    index.apply_flush(7919, positions_for(1000), meta_for(7919, 999))  # entry keys interleave
    started = time.perf_counter()
    metas = index.load_all_meta()
    elapsed_s = time.perf_counter() - started
    assert sorted(metas) == ledger_ids
    assert metas[7919] == meta_for(7919, 999)
    assert metas[15838] == meta_for(15838, 15838 % 50)
    with capsys.disabled():
        print(f"\nload_all_meta of 10,000 ledgers: {elapsed_s * 1000:.1f} ms")
    assert elapsed_s < 2.0  # generous: it takes tens of milliseconds


def test_load_all_meta_refuses_an_unknown_meta_version(index: Index, index_path: Path) -> None:
    index.put_meta(meta_for(1))
    index.close()
    with plyvel.DB(str(index_path)) as db:
        key = b"m" + (1).to_bytes(8, "big")
        db.put(key, b"\x09" + db.get(key)[1:])
    with Index(index_path) as reopened, pytest.raises(ValueError, match="version 9"):
        reopened.load_all_meta()


def test_delete_ledger_removes_only_that_ledger(index: Index, index_path: Path) -> None:
    neighbours = [0, 1, 2, 255, 256, 257, 2**40, 2**40 + 1, MAX_ID]
    for ledger_id in neighbours:
        index.apply_flush(ledger_id, positions_for(20), meta_for(ledger_id, 19))
    for deleted in (1, 256, 2**40):
        index.delete_ledger(deleted)
        assert index.get_meta(deleted) is None
        assert index.count_positions(deleted) == 0
        assert index.get_position(deleted, 0) is None
    survivors = [ledger_id for ledger_id in neighbours if ledger_id not in (1, 256, 2**40)]
    for ledger_id in survivors:
        assert index.get_meta(ledger_id) == meta_for(ledger_id, 19)
        assert list(index.iter_positions(ledger_id)) == positions_for(20)
    assert sorted(index.load_all_meta()) == survivors
    index.close()
    # nothing of the deleted ledgers is left in the DB at all
    deleted_prefixes = {
        prefix + ledger_id.to_bytes(8, "big") for prefix in (b"e", b"m") for ledger_id in (1, 256)
    }
    assert not [key for key in raw_keys(index_path) if key[:9] in deleted_prefixes]


def test_delete_of_an_unknown_ledger_is_harmless(index: Index) -> None:
    index.apply_flush(1, positions_for(2), meta_for(1, 1))
    index.delete_ledger(2)
    assert index.count_positions(1) == 2


@given(
    ledger_id=st.integers(0, MAX_ID),
    state=st.sampled_from(LedgerState),
    fenced=st.booleans(),
    last_entry_id=st.integers(-1, MAX_ID),
    first_entry_id=st.integers(-1, MAX_ID),
    sealed_last_entry_id=st.integers(-1, MAX_ID),
    entry_count=st.integers(0, 2**64 - 1),
    payload_bytes=st.integers(0, 2**64 - 1),
    log_end=st.integers(0, 2**64 - 1),
    durable_seq=st.integers(-1, MAX_ID),
    created_ms=st.integers(0, 2**64 - 1),
    lac=st.integers(-1, MAX_ID),
    master_key=st.none() | st.binary(max_size=64),
)
def test_ledger_meta_encode_decode_round_trip(
    ledger_id: int,
    state: LedgerState,
    fenced: bool,
    last_entry_id: int,
    first_entry_id: int,
    sealed_last_entry_id: int,
    entry_count: int,
    payload_bytes: int,
    log_end: int,
    durable_seq: int,
    created_ms: int,
    lac: int,
    master_key: bytes | None,
) -> None:
    meta = LedgerMeta(
        ledger_id=ledger_id,
        state=state,
        fenced=fenced,
        last_entry_id=last_entry_id,
        first_entry_id=first_entry_id,
        sealed_last_entry_id=sealed_last_entry_id,
        entry_count=entry_count,
        payload_bytes=payload_bytes,
        log_end=log_end,
        durable_seq=durable_seq,
        created_ms=created_ms,
        lac=lac,
        master_key=master_key,
    )
    encoded = meta.encode()
    # version 2: four u8 fields, nine 64-bit fields, the key's length, the key
    assert len(encoded) == 77 + (0 if master_key is None else len(master_key))
    assert LedgerMeta.decode(ledger_id, encoded) == meta


# --- node values, durability, lifetime ------------------------------------------------------


def test_node_values(index: Index) -> None:
    assert index.get_node_value("format_version") is None
    index.put_node_value("format_version", b"\x01")
    index.put_node_value("instance_id", "é".encode())
    assert index.get_node_value("format_version") == b"\x01"
    assert index.get_node_value("instance_id") == "é".encode()
    with pytest.raises(ValueError, match="non-empty name"):
        index.put_node_value("", b"")
    # node values are not ledgers
    assert index.load_all_meta() == {}


def test_sync_writes_a_marker(index: Index) -> None:
    index.apply_flush(1, positions_for(3), meta_for(1, 2))
    index.sync()
    index.sync()
    assert index.get_node_value(SYNC_MARKER_NAME) == (2).to_bytes(8, "big")
    index.apply_flush(2, positions_for(3), meta_for(2, 2), sync=True)
    index.delete_ledger(2, sync=True)
    index.put_meta(meta_for(3), sync=True)
    assert sorted(index.load_all_meta()) == [1, 3]


def test_reopen_after_close_sees_the_data(index_path: Path) -> None:
    with Index(index_path) as first:
        first.apply_flush(11, positions_for(50), meta_for(11, 49))
        first.put_node_value("instance_id", b"abc")
    assert first.closed
    with Index(index_path, create=False) as second:
        assert list(second.iter_positions(11)) == positions_for(50)
        assert second.get_meta(11) == meta_for(11, 49)
        assert second.get_node_value("instance_id") == b"abc"


def test_opening_an_open_index_again_is_a_clear_error(index: Index, index_path: Path) -> None:
    with pytest.raises(IndexOpenError) as caught:
        Index(index_path)
    message = str(caught.value)
    assert str(index_path) in message
    assert "lock" in message
    assert "--data-dir" in message
    assert caught.value.path == index_path
    # the first one is unharmed
    index.put_node_value("still", b"works")
    assert index.get_node_value("still") == b"works"


def test_an_index_open_in_another_process_is_a_clear_error(index_path: Path) -> None:
    Index(index_path).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import plyvel, sys; db = plyvel.DB(sys.argv[1]); print('open', flush=True); "
            "sys.stdin.read()",
            str(index_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(IndexOpenError, match="another process") as caught:
            Index(index_path)
        assert "LOCK" in caught.value.cause
    finally:
        holder.communicate("", timeout=30)


def test_opening_a_missing_index_without_create_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "index"
    with pytest.raises(IndexOpenError, match="does not exist") as caught:
        Index(path, create=False)
    assert "--data-dir" in str(caught.value)
    assert not path.exists()


def test_close_is_idempotent_and_releases_the_lock(index_path: Path) -> None:
    first = Index(index_path)
    first.close()
    first.close()
    with Index(index_path) as second:
        assert second.load_all_meta() == {}


def test_ledgers_with_positions_lists_each_ledger_once(index: Index) -> None:
    for ledger_id in (3, 70, 2**40):
        positions = [(entry_id, 512 + 100 * entry_id, 100) for entry_id in range(5)]
        index.apply_flush(ledger_id, positions, meta_for(ledger_id))
    index.put_meta(meta_for(9))  # metadata alone: no positions
    assert list(index.ledgers_with_positions()) == [3, 70, 2**40]
