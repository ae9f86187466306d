"""Spare journal segments: zero-filled ahead of need, taken by rolls, never in the way.

The files are real, on the real filesystem: a spare must be all zeros and exactly a
segment long, a roll must reuse its blocks (same inode), and whatever a crash or a
full disk leaves must neither lose a record nor confuse the next start.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

import pora
from journal.format import RecordKind
from journal.reader import JournalScanner
from journal.request import Request
from journal.segment import SegmentWriter, list_segments
from journal.spares import PARTIAL_SUFFIX, SPARE_SUFFIX, SpareSegments
from journal.trim import delete_segments
from journal.watermark import JournalState, Watermark

SEGMENT_BYTES = 64 * 1024


def spare_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SPARE_SUFFIX}"))


def make_spares(directory: Path, spares_max: int = 1) -> SpareSegments:
    directory.mkdir(parents=True, exist_ok=True)
    return SpareSegments(directory, segment_bytes=SEGMENT_BYTES, spares_max=spares_max, fsync=True)


def test_a_spare_is_a_whole_segment_of_zeros_and_is_handed_out_once(tmp_path: Path) -> None:
    spares = make_spares(tmp_path, spares_max=2)
    assert spares.wanted()
    assert spares.make_one()
    assert spares.make_one()
    assert not spares.wanted()  # the maximum is ready
    files = spare_files(tmp_path)
    assert len(files) == 2
    for path in files:
        assert path.read_bytes() == bytes(SEGMENT_BYTES)
    assert not list(tmp_path.glob(f"*{PARTIAL_SUFFIX}"))
    taken = {spares.take(), spares.take()}
    assert taken == set(files)
    assert spares.take() is None
    assert (spares.made, spares.taken) == (2, 2)


def test_a_roll_takes_the_spare_and_every_record_reads_back(tmp_path: Path) -> None:
    spares = make_spares(tmp_path)
    writer = SegmentWriter(tmp_path, segment_bytes=SEGMENT_BYTES, first_seq=0, spares=spares)
    assert spares.make_one()
    (spare,) = spare_files(tmp_path)
    spare_inode = spare.stat().st_ino
    payloads = [bytes([i]) * 3000 for i in range(40)]  # 120 kB: at least one roll
    for seq, payload in enumerate(payloads):
        writer.write_batch([Request(RecordKind.ENTRY, 9, seq, payload)], seq)
        writer.sync()
    writer.close()
    segments = list_segments(tmp_path)
    assert len(segments) >= 2
    # the second segment is the spare, renamed: the same blocks, no new allocation
    assert segments[1].path.stat().st_ino == spare_inode
    assert spare_files(tmp_path) == []
    assert spares.taken == 1
    records = [record for batch in JournalScanner(tmp_path).batches() for record in batch]
    assert [record.payload for record in records] == payloads
    assert [record.seq for record in records] == list(range(40))


def test_without_a_spare_a_roll_preallocates_and_does_not_wait(tmp_path: Path) -> None:
    spares = make_spares(tmp_path)  # none made
    writer = SegmentWriter(tmp_path, segment_bytes=SEGMENT_BYTES, first_seq=0, spares=spares)
    for seq in range(40):
        writer.write_batch([Request(RecordKind.ENTRY, 9, seq, b"x" * 3000)], seq)
    writer.close()
    assert len(list_segments(tmp_path)) >= 2
    assert all(s.path.stat().st_size == SEGMENT_BYTES for s in list_segments(tmp_path)[:-1])
    assert spares.taken == 0


def test_adopt_keeps_good_spares_and_deletes_what_a_crash_or_a_resize_left(
    tmp_path: Path,
) -> None:
    good = tmp_path / f"spare-1{SPARE_SUFFIX}"
    good.write_bytes(bytes(SEGMENT_BYTES))
    partial = tmp_path / f"spare-2{PARTIAL_SUFFIX}"
    partial.write_bytes(bytes(1000))  # a crash while zero-filling
    resized = tmp_path / f"spare-3{SPARE_SUFFIX}"
    resized.write_bytes(bytes(SEGMENT_BYTES // 2))  # made before segment_bytes changed
    taken = tmp_path / f"spare-4{SPARE_SUFFIX}"
    taken.write_bytes(bytes(SEGMENT_BYTES))
    # a crash between linking a spare to a segment's name and unlinking the spare
    os.link(taken, tmp_path / "00000000000000000000-4.journal")
    spares = make_spares(tmp_path, spares_max=1)
    spares.adopt()
    assert spare_files(tmp_path) == [good]
    assert not partial.exists()
    assert (tmp_path / "00000000000000000000-4.journal").exists()  # the segment stays
    assert spares.take() == good


def test_stop_abandons_a_spare_part_way_and_leaves_no_file(tmp_path: Path) -> None:
    spares = SpareSegments(tmp_path, segment_bytes=1 << 30, spares_max=1, fsync=False)
    outcome: list[bool] = []
    maker = threading.Thread(target=lambda: outcome.append(spares.make_one()))
    maker.start()
    spares.stop()
    maker.join(timeout=30)
    assert outcome == [False]
    assert list(tmp_path.iterdir()) == []
    assert not spares.wanted()


async def test_a_busy_node_makes_spares_rolls_into_them_and_keeps_one_for_the_next_start(
    data_dir: Path,
) -> None:
    journal_dir = data_dir / "journal"
    payloads: list[bytes] = []
    async with pora.open_node(data_dir, segment_bytes=SEGMENT_BYTES) as node:
        # a spare is made in a thread while the adds go on, so not every roll finds
        # one ready; a node that keeps writing soon rolls into one
        while node.statistics().journal.spare_segments_taken == 0 and len(payloads) < 3000:
            payload = bytes([len(payloads) % 251]) * 2000
            await node.add_entry(5, len(payloads), payload)
            payloads.append(payload)
        stats = node.statistics().journal
        assert stats.spare_segments_taken >= 1
        assert stats.spare_segments_made >= stats.spare_segments_taken
    assert len(spare_files(journal_dir)) <= 1
    leftover = spare_files(journal_dir)
    async with pora.open_node(data_dir, segment_bytes=SEGMENT_BYTES) as node:
        for entry_id, payload in enumerate(payloads):
            assert await node.read_entry(5, entry_id) == payload
        if leftover:  # the new start's first segment is the last run's spare
            assert node.statistics().journal.spare_segments_taken == 1
            assert not leftover[0].exists()


async def test_a_node_that_writes_little_makes_no_spare(data_dir: Path) -> None:
    async with pora.open_node(data_dir, segment_bytes=SEGMENT_BYTES) as node:
        await node.add_entry(1, 0, b"small")  # far below a quarter of a segment
        assert node.statistics().journal.spare_segments_made == 0
    assert spare_files(data_dir / "journal") == []


async def test_without_preallocation_or_with_none_asked_no_spare_is_made(data_dir: Path) -> None:
    for options in ({"preallocate": False}, {"spare_segments_max": 0}):
        directory = data_dir / next(iter(options))
        async with pora.open_node(directory, segment_bytes=SEGMENT_BYTES, **options) as node:
            for entry_id in range(100):
                await node.add_entry(2, entry_id, b"z" * 2000)
            assert node.statistics().journal.spare_segments_made == 0
        assert spare_files(directory / "journal") == []


def test_spare_segments_max_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="spare_segments_max"):
        pora.NodeConfig.from_options(spare_segments_max=-1)


async def test_a_full_disk_while_making_a_spare_loses_nothing(
    tiny_filesystem: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tiny_filesystem / "pora-data"
    # a 1 MiB filesystem: the first 512 KiB segment fits, its spare does not
    async with pora.open_node(
        data_dir, segment_bytes=512 << 10, entrylog_prealloc_bytes=4096
    ) as node:
        for entry_id in range(80):  # 160 kB: past a quarter, so a spare is wanted
            await node.add_entry(6, entry_id, bytes([entry_id]) * 2000)
        # the spare's thread meets the full disk while the adds go on
        with trio.fail_after(20):
            while "could not make a spare journal segment" not in caplog.text:  # noqa: ASYNC110
                await trio.sleep(0.01)
        stats = node.statistics().journal
        assert stats.spare_segments_made == 0
        assert not stats.failed
        assert not list((data_dir / "journal").glob(f"*{PARTIAL_SUFFIX}"))
        for entry_id in range(80, 100):  # the journal goes on
            await node.add_entry(6, entry_id, bytes([entry_id]) * 2000)
        for entry_id in range(100):
            assert await node.read_entry(6, entry_id) == bytes([entry_id]) * 2000
        # no retry while the same segment is open: a full disk is not hammered
        assert caplog.text.count("could not make a spare journal segment") == 1


# --- recycled segments: a trimmed segment becomes the next spare -------------------------


def write_until_roll(writer: SegmentWriter, ledger_id: int, payload_bytes: int) -> list[bytes]:
    """Write one-entry batches (synced) until the writer rolls; return their payloads."""
    written: list[bytes] = []
    segment = writer.open_segment
    while writer.open_segment == segment:
        seq = writer.next_seq
        payload = bytes([seq % 251]) * payload_bytes
        writer.write_batch([Request(RecordKind.ENTRY, ledger_id, seq, payload)], seq)
        writer.sync()
        written.append(payload)
    return written


def scan_payloads(directory: Path) -> tuple[list[bytes], JournalScanner]:
    scanner = JournalScanner(directory)
    payloads = [record.payload for batch in scanner.batches() for record in batch]
    return payloads, scanner


def recycled_journal(directory: Path) -> tuple[SegmentWriter, SpareSegments, list[bytes], int]:
    """A writer whose open segment is a recycled one, holding two small batches and,
    after them, the batches of its earlier life. Returns the writer, the spares,
    every payload that must read back, and the inode of the recycled file."""
    spares = make_spares(directory)
    writer = SegmentWriter(
        directory, segment_bytes=SEGMENT_BYTES, first_seq=0, spares=spares, unsynced_batches_max=2
    )
    write_until_roll(writer, 3, 3000)  # the first segment, full of batches
    first, second = list_segments(directory)
    inode = first.path.stat().st_ino
    holding = Watermark(JournalState.HOLDING, second.first_seq)
    # nothing freed
    assert delete_segments(directory, [first], watermark=holding, recycle_into=spares) == 0
    assert (spares.recycled, spares.ready_count) == (1, 1)
    (spare,) = spare_files(directory)
    assert spare.stat().st_ino == inode and any(spare.read_bytes()[512:])  # bytes and all
    # what must read back: the second segment's batches, then what goes into the third
    expected = scan_payloads(directory)[0]
    expected += write_until_roll(writer, 3, 3000)
    assert writer.open_segment.path.stat().st_ino == inode  # the roll took the recycled one
    for _ in range(2):
        seq = writer.next_seq
        payload = b"new life %d" % seq
        writer.write_batch([Request(RecordKind.ENTRY, 3, seq, payload)], seq)
        writer.sync()
        expected.append(payload)
    return writer, spares, expected, inode


def test_a_trimmed_segment_becomes_a_spare_and_its_old_batches_never_read_back(
    tmp_path: Path,
) -> None:
    writer, _spares, expected, _inode = recycled_journal(tmp_path)
    writer.close()
    last = list_segments(tmp_path)[-1]
    data = last.path.read_bytes()
    end = writer.open_segment_bytes_used
    assert data[end : end + 512] == bytes(512)  # the writer's end-of-data block
    assert data.find(b"PBAT", end) > 0  # and the earlier life's batches after it
    payloads, scanner = scan_payloads(tmp_path)
    assert payloads == expected
    assert scanner.summary.torn_tail is None


def test_a_torn_batch_in_a_recycled_segment_is_a_torn_tail_not_corruption(
    tmp_path: Path,
) -> None:
    writer, _spares, expected, _inode = recycled_journal(tmp_path)
    writer.close()
    last = list_segments(tmp_path)[-1]
    # the last batch's payload damaged, as a write cut short would leave it: the old
    # life's valid batches after it must not pass for batches written while it synced
    torn_at = writer.open_segment_bytes_used - 512
    with open(last.path, "r+b") as file:
        file.seek(torn_at + 24 + 16 + 32)  # batch header, record prefix, body header
        file.write(b"\xff" * 8)
    payloads, scanner = scan_payloads(tmp_path)
    assert payloads == expected[:-1]
    torn = scanner.summary.torn_tail
    assert torn is not None and (torn.offset, torn.batches_after) == (torn_at, 0)


def test_a_stale_batch_where_the_data_ends_ends_it(tmp_path: Path) -> None:
    """Without the end-of-data block (lost, or from a writer without it), the earlier
    life's batch found where the next batch would go ends the data: its seq is below
    the segment's first seq."""
    writer, _spares, expected, _inode = recycled_journal(tmp_path)
    writer.close()
    last = list_segments(tmp_path)[-1]
    end = writer.open_segment_bytes_used
    with open(last.path, "r+b") as file:
        data = file.read()
        stale_at = data.find(b"PBAT", end)
        assert stale_at > 0 and stale_at % 512 == 0
        file.seek(end)
        file.write(data[stale_at : stale_at + 512])
    payloads, scanner = scan_payloads(tmp_path)
    assert payloads == expected
    assert scanner.summary.torn_tail is None


def test_a_recycled_segment_that_later_segments_follow_reads_whole(tmp_path: Path) -> None:
    writer, _spares, expected, inode = recycled_journal(tmp_path)
    # a batch too big for what is left of the recycled segment rolls to a fresh one
    seq = writer.next_seq
    big = b"b" * (SEGMENT_BYTES - 4096)
    writer.write_batch([Request(RecordKind.ENTRY, 3, seq, big)], seq)
    writer.sync()
    writer.close()
    segments = list_segments(tmp_path)
    assert segments[-2].path.stat().st_ino == inode  # now a middle segment
    payloads, scanner = scan_payloads(tmp_path)
    assert payloads == [*expected, big]
    assert scanner.summary.torn_tail is None


def test_recycling_keeps_the_pool_bound_and_deletes_the_rest(tmp_path: Path) -> None:
    spares = make_spares(tmp_path, spares_max=1)
    writer = SegmentWriter(tmp_path, segment_bytes=SEGMENT_BYTES, first_seq=0, spares=spares)
    for _ in range(3):
        write_until_roll(writer, 4, 3000)
    writer.close()
    segments = list_segments(tmp_path)
    assert len(segments) == 4
    grown = segments[2]
    with open(grown.path, "r+b") as file:  # one that grew past its preallocation
        file.truncate(SEGMENT_BYTES + 512)
    holding = Watermark(JournalState.HOLDING, segments[3].first_seq)
    freed = delete_segments(tmp_path, segments[:3], watermark=holding, recycle_into=spares)
    # the oldest became the one spare; the pool was then full, and the grown one
    # would never have qualified: both deleted
    assert spares.recycled == 1 and len(spare_files(tmp_path)) == 1
    assert freed == 2 * SEGMENT_BYTES + 512
    assert list_segments(tmp_path) == segments[3:]


async def test_a_busy_node_rolls_into_recycled_segments_and_loses_nothing(data_dir: Path) -> None:
    options: dict[str, Any] = {"segment_bytes": SEGMENT_BYTES, "memtable_flush_bytes": 16 * 1024}
    payloads: list[bytes] = []
    async with pora.open_node(data_dir, **options) as node:
        # trimmed segments become spares before one is zero-filled (Journal.reclaim)
        while len(payloads) < 5000:
            stats = node.statistics().journal
            if stats.spare_segments_recycled >= 3 and stats.spare_segments_taken >= 3:
                break
            payload = bytes([len(payloads) % 251]) * 2000
            await node.add_entry(6, len(payloads), payload)
            payloads.append(payload)
        stats = node.statistics().journal
        assert stats.spare_segments_recycled >= 3
        # most rolls took a recycled segment, not zeros written for it
        assert stats.spare_segments_made < stats.spare_segments_taken
    async with pora.open_node(data_dir, **options) as node:
        for entry_id, payload in enumerate(payloads):
            assert await node.read_entry(6, entry_id) == payload
