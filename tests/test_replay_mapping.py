"""Replay reads a journal segment's bodies as views of its mapping, never copied
(journal/records.py): a view keeps the whole segment mapped. Once replay has
flushed and trimmed the journal, no mapping of a segment may be left, or the
unlinked segments would go on taking their disk space while the node runs."""

from __future__ import annotations

import os
from pathlib import Path

import pora
from journal.format import RecordKind
from journal.request import Request
from journal.segment import SegmentWriter


def mapped_journal_files(journal_dir: Path) -> list[str]:
    """This process's mappings of files in `journal_dir` (deleted ones included)."""
    with open("/proc/self/maps") as maps:
        return [line for line in maps if str(journal_dir) in line]


async def test_no_segment_stays_mapped_after_replay(data_dir: Path) -> None:
    async with pora.open_node(data_dir):
        pass  # lay out the data dir
    journal_dir = data_dir / "journal"
    writer = SegmentWriter(journal_dir, segment_bytes=1 << 20, first_seq=0)
    seq = 0
    for round_ in range(40):  # several segments, three ledgers interleaved
        batch = [
            Request(RecordKind.ENTRY, ledger_id, round_ * 10 + i, os.urandom(900))
            for i in range(10)
            for ledger_id in (1, 2, 3)
        ]
        writer.write_batch(batch, seq)
        seq += len(batch)
    writer.sync()
    writer.close()
    async with pora.open_node(data_dir, recent_bytes_max=1 << 20) as node:
        report = node.statistics().recovery
        assert report.records_replayed == 1200 and report.segments_trimmed > 1
        assert mapped_journal_files(journal_dir) == []
        # every entry is read back (from the entry logs: no view was kept)
        for ledger_id in (1, 2, 3):
            entries = await node.read_range(ledger_id, 0, 400, max_entries=400, max_bytes=1 << 20)
            assert [entry_id for entry_id, _ in entries] == list(range(400))
