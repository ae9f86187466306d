"""The entry log on real files: round trips, positioned rewrites, preallocation,
corruption found by editing bytes, header validation, scans."""

from __future__ import annotations

import errno
import os
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.entrylog import EntryLog, ScannedRecord
from ledger.entrylog_format import (
    FIRST_RECORD_OFFSET,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    RECORD_HEADER_SIZE,
    ZERO_RECORD_HEADER,
    encode_record,
)
from ledger.errors import StorageCorruption, UnindexedEntryLog

CHUNK = 64 * 1024
LEDGER = 7

MakeLog = Callable[..., EntryLog]


@pytest.fixture
def make_log(tmp_path: Path) -> Iterator[MakeLog]:
    opened: list[EntryLog] = []

    def make(
        ledger_id: int = LEDGER, *, name: str = "log", chunk: int = CHUNK, create: bool = True
    ) -> EntryLog:
        path = tmp_path / "07" / f"{name}.log"
        factory = EntryLog.create if create else EntryLog.open
        log = factory(path, ledger_id, prealloc_chunk_bytes=chunk)
        opened.append(log)
        return log

    yield make
    for log in opened:
        log.close()


def entries(count: int, size: int = 100, first: int = 0) -> list[tuple[int, bytes]]:
    return [(entry_id, bytes([entry_id % 251]) * size) for entry_id in range(first, first + count)]


def flip_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        original = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([original ^ 0x40]))


def patch_bytes(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(data)


# --- writing and reading ------------------------------------------------------------


def test_write_then_read_returns_the_same_bytes(make_log: MakeLog) -> None:
    log = make_log()
    written = [(0, b"first"), (1, b""), (2, bytes(range(256)) * 10)]
    positions = log.write_records(written, FIRST_RECORD_OFFSET)
    log.sync()
    assert [entry_id for entry_id, _, _ in positions] == [0, 1, 2]
    for (entry_id, payload), (position_id, offset, record_length) in zip(
        written, positions, strict=True
    ):
        assert position_id == entry_id
        assert record_length == RECORD_HEADER_SIZE + len(payload)
        assert log.read_record(offset, record_length, entry_id) == payload
    assert log.read_records(positions) == [payload for _, payload in written]


def test_records_are_packed_back_to_back(make_log: MakeLog) -> None:
    log = make_log()
    first = log.write_records(entries(3), FIRST_RECORD_OFFSET)
    end = first[-1][1] + first[-1][2]
    second = log.write_records(entries(2, first=3), end)
    offsets = [offset for _, offset, _ in first + second]
    lengths = [length for _, _, length in first + second]
    assert offsets[0] == FIRST_RECORD_OFFSET
    for index in range(1, len(offsets)):
        assert offsets[index] == offsets[index - 1] + lengths[index - 1]


def test_reopen_reads_what_was_written(make_log: MakeLog) -> None:
    log = make_log()
    positions = log.write_records(entries(5), FIRST_RECORD_OFFSET)
    log.sync()
    log.close()
    reopened = make_log(create=False)
    assert reopened.created_ms == log.created_ms
    assert reopened.read_records(positions) == [payload for _, payload in entries(5)]


def test_positioned_rewrite_at_the_same_place_gives_identical_bytes(make_log: MakeLog) -> None:
    log = make_log()
    batch = entries(20, size=333)
    first = log.write_records(batch, FIRST_RECORD_OFFSET)
    log.sync()
    before = log.path.read_bytes()
    # replay after a crash: the same flush rewritten at the same log_end
    again = log.write_records(batch, FIRST_RECORD_OFFSET)
    log.sync()
    assert again == first
    assert log.path.read_bytes() == before


def test_rewrite_overwrites_leftovers_of_a_crashed_flush(make_log: MakeLog) -> None:
    log = make_log()
    log.write_records(entries(4, size=1000), FIRST_RECORD_OFFSET)  # never indexed: crashed
    positions = log.write_records([(0, b"short")], FIRST_RECORD_OFFSET)
    entry_id, offset, record_length = positions[0]
    assert log.read_record(offset, record_length, entry_id) == b"short"


def test_preallocation_grows_by_whole_chunks(make_log: MakeLog) -> None:
    log = make_log()
    stat = os.stat(log.path)
    assert stat.st_size == CHUNK
    assert stat.st_blocks * 512 >= CHUNK  # reserved on disk, not a sparse hole
    assert log.allocated_bytes == CHUNK

    # 150 KiB of records from offset 512: needs 3 chunks in all
    positions = log.write_records(entries(150, size=1024 - RECORD_HEADER_SIZE), HEADER_SIZE)
    data_end = positions[-1][1] + positions[-1][2]
    assert data_end == HEADER_SIZE + 150 * 1024
    stat = os.stat(log.path)
    assert stat.st_size == 3 * CHUNK
    assert stat.st_size >= data_end
    assert stat.st_blocks * 512 >= 3 * CHUNK
    assert log.allocated_bytes == 3 * CHUNK

    # a write that still fits allocates nothing more
    log.write_records([(150, b"x")], data_end)
    assert os.stat(log.path).st_size == 3 * CHUNK

    # a reopened log knows its allocation from the file size
    log.close()
    assert make_log(create=False).allocated_bytes == 3 * CHUNK


def test_write_inside_the_header_is_refused(make_log: MakeLog) -> None:
    log = make_log()
    with pytest.raises(ValueError, match="inside the 512-byte header"):
        log.write_records([(0, b"x")], 0)
    assert log.path.read_bytes()[:8] == MAGIC


def test_negative_entry_id_is_refused_before_anything_is_written(make_log: MakeLog) -> None:
    log = make_log()
    before = log.path.read_bytes()
    with pytest.raises(ValueError, match="entry id -1"):
        log.write_records([(0, b"fine"), (-1, b"bad")], FIRST_RECORD_OFFSET)
    assert log.path.read_bytes() == before


def test_an_all_zero_header_is_never_a_valid_record() -> None:
    # the format relies on it to tell zero fill from a record
    stored_crc = struct.unpack_from("<I", ZERO_RECORD_HEADER)[0]
    assert crc32c.crc32c(ZERO_RECORD_HEADER[4:]) != stored_crc


# --- corruption -------------------------------------------------------------------------


def test_flipped_payload_byte_is_reported_with_path_and_offset(make_log: MakeLog) -> None:
    log = make_log()
    positions = log.write_records(entries(3), FIRST_RECORD_OFFSET)
    log.sync()
    entry_id, offset, record_length = positions[1]
    flip_byte(log.path, offset + RECORD_HEADER_SIZE + 10)
    with pytest.raises(StorageCorruption) as caught:
        log.read_record(offset, record_length, entry_id)
    assert caught.value.path == log.path
    assert caught.value.offset == offset
    assert "checksum mismatch" in caught.value.reason
    assert str(log.path) in str(caught.value)
    assert f"at byte {offset}" in str(caught.value)
    # its neighbours are intact
    assert log.read_record(positions[0][1], positions[0][2], 0) == entries(3)[0][1]
    # a range read that includes it fails at its offset too
    with pytest.raises(StorageCorruption) as caught_range:
        log.read_records(positions)
    assert caught_range.value.offset == offset


def test_flipped_header_byte_is_reported(make_log: MakeLog) -> None:
    log = make_log()
    [(entry_id, offset, record_length)] = log.write_records([(5, b"payload")], FIRST_RECORD_OFFSET)
    flip_byte(log.path, offset + 12)  # inside the ledger id field
    with pytest.raises(StorageCorruption, match="checksum mismatch"):
        log.read_record(offset, record_length, entry_id)


def test_wrong_entry_id_asked_is_corruption(make_log: MakeLog) -> None:
    log = make_log()
    [(_, offset, record_length)] = log.write_records([(5, b"payload")], FIRST_RECORD_OFFSET)
    with pytest.raises(StorageCorruption) as caught:
        log.read_record(offset, record_length, 6)
    assert caught.value.offset == offset
    assert "holds entry 5" in caught.value.reason
    assert "says entry 6" in caught.value.reason


def test_wrong_record_length_is_corruption(make_log: MakeLog) -> None:
    log = make_log()
    [(entry_id, offset, record_length)] = log.write_records([(5, b"payload")], FIRST_RECORD_OFFSET)
    with pytest.raises(StorageCorruption, match="payload of 7 bytes"):
        log.read_record(offset, record_length + 1, entry_id)
    with pytest.raises(StorageCorruption, match="no valid record"):
        log.read_record(offset, RECORD_HEADER_SIZE - 1, entry_id)


def test_record_of_another_ledger_is_corruption(tmp_path: Path) -> None:
    # an index pointing into the wrong file: same layout, other ledger id
    path = tmp_path / "log"
    with EntryLog.create(path, 1, prealloc_chunk_bytes=CHUNK) as other:
        [(entry_id, offset, record_length)] = other.write_records([(0, b"x")], HEADER_SIZE)
    ours = tmp_path / "ours"
    with EntryLog.create(ours, 2, prealloc_chunk_bytes=CHUNK) as log:
        patch_bytes(ours, offset, path.read_bytes()[offset : offset + record_length])
        with pytest.raises(StorageCorruption, match="belongs to ledger 1"):
            log.read_record(offset, record_length, entry_id)


def test_read_in_zero_fill_is_corruption(make_log: MakeLog) -> None:
    log = make_log()
    with pytest.raises(StorageCorruption, match="zero fill"):
        log.read_record(FIRST_RECORD_OFFSET, RECORD_HEADER_SIZE + 6, 0)


def test_read_past_the_end_of_the_file_is_corruption(make_log: MakeLog) -> None:
    log = make_log()
    with pytest.raises(StorageCorruption, match="runs past the end"):
        log.read_record(CHUNK - 10, RECORD_HEADER_SIZE + 6, 0)


# --- range reads ------------------------------------------------------------------------


def test_read_records_coalesces_neighbours_into_few_preads(
    make_log: MakeLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log()
    positions = log.write_records(entries(100), FIRST_RECORD_OFFSET)
    far = log.write_records([(100, b"far")], positions[-1][1] + positions[-1][2] + 20_000)
    calls: list[tuple[int, int]] = []
    real_pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        calls.append((length, offset))
        return real_pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    payloads = log.read_records(positions + far)
    assert payloads == [payload for _, payload in entries(100)] + [b"far"]
    assert len(calls) == 2  # the 100 neighbours together, the distant one alone

    calls.clear()
    every_other = positions[::2]  # gaps of one 124-byte record: still one read
    assert log.read_records(every_other) == [payload for _, payload in entries(100)[::2]]
    assert len(calls) == 1


def test_read_records_refuses_unsorted_positions(make_log: MakeLog) -> None:
    log = make_log()
    positions = log.write_records(entries(3), FIRST_RECORD_OFFSET)
    with pytest.raises(ValueError, match="sorted by offset"):
        log.read_records(list(reversed(positions)))


def test_reads_run_concurrently_with_one_writer(make_log: MakeLog) -> None:
    log = make_log(chunk=4096)
    written = log.write_records(entries(50, size=500), FIRST_RECORD_OFFSET)
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                for entry_id, offset, record_length in written:
                    assert (
                        log.read_record(offset, record_length, entry_id)
                        == bytes([entry_id % 251]) * 500
                    )
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    end = written[-1][1] + written[-1][2]
    for batch in range(50):
        more = log.write_records(entries(20, size=700, first=50 + batch * 20), end)
        end = more[-1][1] + more[-1][2]
    stop.set()
    for thread in threads:
        thread.join()
    assert errors == []


# --- scan -------------------------------------------------------------------------------


def test_scan_finds_every_record_and_stops_at_zero_fill(make_log: MakeLog) -> None:
    log = make_log()
    positions = log.write_records(entries(200, size=97), FIRST_RECORD_OFFSET)
    scanned = list(log.scan())
    assert scanned == [
        ScannedRecord(
            offset=offset,
            entry_id=entry_id,
            ledger_id=LEDGER,
            record_length=record_length,
            payload_length=record_length - RECORD_HEADER_SIZE,
            crc_ok=True,
        )
        for entry_id, offset, record_length in positions
    ]


def test_scan_of_a_new_log_finds_nothing(make_log: MakeLog) -> None:
    assert list(make_log().scan()) == []


def test_scan_reports_a_flipped_byte_and_stops(make_log: MakeLog) -> None:
    log = make_log()
    positions = log.write_records(entries(10), FIRST_RECORD_OFFSET)
    _, bad_offset, _ = positions[4]
    flip_byte(log.path, bad_offset + RECORD_HEADER_SIZE + 1)
    scanned = list(log.scan())
    assert [record.crc_ok for record in scanned] == [True] * 4 + [False]
    assert scanned[-1].offset == bad_offset
    assert scanned[-1].entry_id == 4


def test_scan_stops_at_end_and_flags_a_record_crossing_it(make_log: MakeLog) -> None:
    log = make_log()
    positions = log.write_records(entries(10), FIRST_RECORD_OFFSET)
    end_of_fifth = positions[4][1] + positions[4][2]
    assert [record.entry_id for record in log.scan(end=end_of_fifth)] == [0, 1, 2, 3, 4]
    # `end` in the middle of a header: stop without a record
    assert len(list(log.scan(end=end_of_fifth + 10))) == 5
    # `end` in the middle of a payload: that record cannot be whole
    crossing = list(log.scan(end=end_of_fifth + RECORD_HEADER_SIZE + 5))
    assert [record.crc_ok for record in crossing] == [True] * 5 + [False]
    # a scan can start at any record boundary
    assert [record.entry_id for record in log.scan(start=end_of_fifth)] == [5, 6, 7, 8, 9]


def test_scan_stops_where_a_header_would_run_past_the_file(tmp_path: Path) -> None:
    chunk = 1024
    with EntryLog.create(tmp_path / "log", 1, prealloc_chunk_bytes=chunk) as log:
        # fill the file to 10 bytes short of its end
        payload_length = chunk - HEADER_SIZE - RECORD_HEADER_SIZE - 10
        log.write_records([(0, b"p" * payload_length)], HEADER_SIZE)
        assert log.allocated_bytes == chunk
        patch_bytes(log.path, chunk - 10, b"\xff" * 10)  # junk, not zero fill
        assert [record.entry_id for record in log.scan()] == [0]


def test_scan_flags_an_impossible_length(make_log: MakeLog) -> None:
    log = make_log()
    positions = log.write_records(entries(3), FIRST_RECORD_OFFSET)
    patch_bytes(log.path, positions[1][1] + 4, struct.pack("<I", 0xFFFFFFF0))
    scanned = list(log.scan())
    assert [record.crc_ok for record in scanned] == [True, False]
    assert scanned[1].payload_length == 0xFFFFFFF0


# --- header -----------------------------------------------------------------------------


def test_open_rejects_wrong_magic(make_log: MakeLog) -> None:
    log = make_log()
    log.close()
    patch_bytes(log.path, 0, b"NOTALOG!")
    with pytest.raises(StorageCorruption) as caught:
        make_log(create=False)
    assert caught.value.offset == 0
    assert caught.value.path == log.path
    assert "not a Pora entry log" in caught.value.reason


def test_open_rejects_unknown_version_naming_it(make_log: MakeLog) -> None:
    log = make_log()
    log.close()
    patch_bytes(log.path, 8, struct.pack("<H", 9))
    with pytest.raises(StorageCorruption, match="format version 9 is unknown") as caught:
        make_log(create=False)
    assert caught.value.offset == 0


def test_open_rejects_another_ledgers_log(make_log: MakeLog) -> None:
    log = make_log(ledger_id=3)
    log.close()
    with pytest.raises(StorageCorruption, match="header says ledger 3, expected ledger 4"):
        make_log(ledger_id=4, create=False)


def test_open_rejects_a_damaged_header(make_log: MakeLog) -> None:
    log = make_log()
    log.close()
    flip_byte(log.path, 20)  # inside created_ms
    with pytest.raises(StorageCorruption, match="header checksum mismatch"):
        make_log(create=False)


def test_open_rejects_a_file_shorter_than_the_header(tmp_path: Path) -> None:
    path = tmp_path / "short.log"
    path.write_bytes(MAGIC)
    with pytest.raises(StorageCorruption, match="shorter than the 512-byte header"):
        EntryLog.open(path, 1, prealloc_chunk_bytes=CHUNK)


def test_open_of_a_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        EntryLog.open(tmp_path / "missing.log", 1, prealloc_chunk_bytes=CHUNK)


def test_header_layout(make_log: MakeLog) -> None:
    log = make_log(ledger_id=2**40 + 3)
    block = log.path.read_bytes()[:HEADER_SIZE]
    magic, version, reserved, ledger_id, created_ms, stored_crc = HEADER.unpack_from(block)
    assert (magic, version, reserved, ledger_id) == (MAGIC, FORMAT_VERSION, 0, 2**40 + 3)
    assert created_ms == log.created_ms > 0
    assert stored_crc == crc32c.crc32c(block[: HEADER.size - 4])
    assert block[HEADER.size :] == bytes(HEADER_SIZE - HEADER.size)


def test_create_over_a_log_holding_entries_refuses_and_changes_nothing(
    make_log: MakeLog,
) -> None:
    # what a lost index leaves: the log of a ledger the index does not know
    old = make_log()
    old.write_records(entries(100, size=2000), FIRST_RECORD_OFFSET)
    old.sync()
    old.close()
    before = old.path.read_bytes()

    log = make_log()  # a new add to the same ledger id, entry 100, written
    with pytest.raises(UnindexedEntryLog, match="verify --rebuild-index") as caught:
        log.write_bodies([encode_record(LEDGER, 100, b"new")], FIRST_RECORD_OFFSET)
    assert isinstance(caught.value, OSError)  # a flush keeps its entries and retries
    assert old.path.read_bytes() == before


def test_create_over_another_ledgers_log_refuses(make_log: MakeLog) -> None:
    other = make_log(ledger_id=1)
    other.close()
    before = other.path.read_bytes()
    with pytest.raises(UnindexedEntryLog, match="ledger 1, expected ledger 2"):
        make_log(ledger_id=2)
    assert other.path.read_bytes() == before


@pytest.mark.parametrize("size", [0, HEADER_SIZE, CHUNK])
def test_create_reuses_a_file_a_crash_left_before_its_header(
    make_log: MakeLog, tmp_path: Path, size: int
) -> None:
    path = tmp_path / "07" / "log.log"
    path.parent.mkdir()
    path.write_bytes(bytes(size))
    log = make_log()
    positions = log.write_records(entries(3), FIRST_RECORD_OFFSET)
    assert log.read_record(*positions[2][1:], 2) == entries(3)[2][1]
    log.close()
    assert [record.entry_id for record in make_log(create=False).scan()] == [0, 1, 2]


def test_create_reuses_an_empty_log_of_the_same_ledger(make_log: MakeLog) -> None:
    make_log().close()  # created; the index never heard of it before a crash
    log = make_log()
    log.write_records(entries(2), FIRST_RECORD_OFFSET)
    assert [record.entry_id for record in log.scan()] == [0, 1]


def test_create_over_a_cut_first_flush_takes_the_same_flush_again(make_log: MakeLog) -> None:
    # the first flush wrote and synced, then the crash came before the index recorded
    # it; the journal replays those entries and more
    cut = make_log()
    cut.write_records(entries(5), FIRST_RECORD_OFFSET)
    cut.sync()
    cut.close()
    log = make_log()
    log.write_records(entries(8), FIRST_RECORD_OFFSET)
    assert [record.entry_id for record in log.scan()] == list(range(8))


def test_create_over_a_cut_flush_refuses_a_write_with_other_bytes(make_log: MakeLog) -> None:
    cut = make_log()
    cut.write_records(entries(5), FIRST_RECORD_OFFSET)
    cut.close()
    before = cut.path.read_bytes()
    log = make_log()
    with pytest.raises(UnindexedEntryLog, match="entry 0 at byte 512, with other bytes"):
        log.write_records(entries(5, size=99), FIRST_RECORD_OFFSET)
    assert log.path.read_bytes() == before


def test_create_makes_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c.log"
    with EntryLog.create(path, 1, prealloc_chunk_bytes=CHUNK) as log:
        assert log.path == path
    assert path.is_file()


def test_closed_log_refuses_io(make_log: MakeLog) -> None:
    log = make_log()
    log.close()
    log.close()  # idempotent
    assert log.closed
    with pytest.raises(ValueError, match="closed"):
        log.write_records([(0, b"x")], FIRST_RECORD_OFFSET)
    with pytest.raises(ValueError, match="closed"):
        log.read_record(FIRST_RECORD_OFFSET, 25, 0)


def test_full_disk_is_found_by_preallocation_before_data_is_written(
    tiny_filesystem: Path,
) -> None:
    # 1 MiB filesystem: the first 512 KiB chunk fits, growing to 1.5 MiB does not
    with EntryLog.create(tiny_filesystem / "log", 1, prealloc_chunk_bytes=512 * 1024) as log:
        before = log.path.read_bytes()
        with pytest.raises(OSError) as caught:
            log.write_records([(0, b"x" * 1_200_000)], FIRST_RECORD_OFFSET)
        assert caught.value.errno == errno.ENOSPC
        assert log.path.read_bytes()[: len(before)] == before
        assert list(log.scan()) == []


# --- property ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=40),
    first_entry=st.integers(min_value=0, max_value=2**63 - 100),
    gap=st.integers(min_value=0, max_value=5000),
)
def test_round_trip_of_any_payloads(payloads: list[bytes], first_entry: int, gap: int) -> None:
    batch = [(first_entry + index, payload) for index, payload in enumerate(payloads)]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "log"
        with EntryLog.create(path, 2**63 - 1, prealloc_chunk_bytes=4096) as log:
            position = FIRST_RECORD_OFFSET + gap
            positions = log.write_records(batch, position)
            assert positions[0][1] == position
            for (entry_id, payload), (_, offset, record_length) in zip(
                batch, positions, strict=True
            ):
                assert log.read_record(offset, record_length, entry_id) == payload
            assert log.read_records(positions) == payloads
            assert os.stat(path).st_size % 4096 == 0
            scanned = list(log.scan(start=position))
            assert [(r.entry_id, r.offset, r.record_length) for r in scanned] == positions
            assert all(r.crc_ok and r.ledger_id == 2**63 - 1 for r in scanned)
