"""Journal segments below the watermark: left by a trim or a clean stop that was cut
short between writing the watermark and deleting the segments, or put back into
`journal/` by hand (a restored backup). Everything in them is durable elsewhere or
was deleted on purpose: replay leaves them out and deletes them, and refuses
nothing."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import pora
import pora.node.node
from journal.segment import list_segments
from journal.watermark import JournalState, Watermark, read_watermark, write_watermark

QUIET: dict[str, Any] = {
    "segment_bytes": 64 * 1024,
    "flush_interval_ms": 3_600_000.0,
    "trim_interval_ms": 3_600_000.0,
    "spare_segments_max": 0,
}
ENTRIES = 100


def entry_payload(ledger_id: int, entry_id: int) -> bytes:
    return (b"%d/%d " % (ledger_id, entry_id)) * 200


async def add_to_1_and_2_then_delete_1(node: pora.Node) -> None:
    for entry_id in range(ENTRIES):
        for ledger_id in (1, 2):
            await node.add_entry(ledger_id, entry_id, entry_payload(ledger_id, entry_id))
    await node.delete_ledger(1)


async def assert_1_deleted_2_whole(data_dir: Path) -> None:
    async with pora.open_node(data_dir, **QUIET) as node:
        assert [info.ledger_id for info in node.ledgers()] == [2]
        with pytest.raises(pora.NoSuchLedger):
            await node.last_entry_id(1)
        for entry_id in range(ENTRIES):
            assert await node.read_entry(2, entry_id) == entry_payload(2, entry_id)


async def test_a_segment_put_back_below_the_watermark_resurrects_nothing(
    data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backup = tmp_path / "journal-backup"
    backup.mkdir()
    async with pora.open_node(data_dir, **QUIET) as node:
        await add_to_1_and_2_then_delete_1(node)
        oldest = list_segments(data_dir / "journal")[0].path
        shutil.copy(oldest, backup / oldest.name)
    watermark = read_watermark(data_dir / "journal")
    assert watermark is not None and watermark.state is JournalState.EMPTY
    # an old segment comes back (a restored backup, a careless copy): its entries of
    # ledger 1 were deleted on purpose, those of ledger 2 are in its entry log
    shutil.copy(backup / oldest.name, data_dir / "journal" / oldest.name)

    await assert_1_deleted_2_whole(data_dir)
    assert list_segments(data_dir / "journal") == []
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(oldest.name in m and "below the journal watermark" in m for m in warned), warned
    await assert_1_deleted_2_whole(data_dir)


class CutShort(Exception):
    """Stands for a crash between the watermark's write and the segments' deletes."""


async def test_a_clean_stop_cut_short_after_the_watermark_is_no_refusal(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cut_short(directory: Path, segments: object, *, watermark: Watermark) -> int:
        write_watermark(directory, watermark)
        raise CutShort(directory)

    with monkeypatch.context() as patch:
        patch.setattr(pora.node.lifecycle, "delete_segments", cut_short)
        with pytest.RaisesGroup(CutShort, allow_unwrapped=True, flatten_subgroups=True):
            async with pora.open_node(data_dir, **QUIET) as node:
                await add_to_1_and_2_then_delete_1(node)
    assert len(list_segments(data_dir / "journal")) > 2
    watermark = read_watermark(data_dir / "journal")
    assert watermark is not None and watermark.state is JournalState.EMPTY

    await assert_1_deleted_2_whole(data_dir)
    assert list_segments(data_dir / "journal") == []
