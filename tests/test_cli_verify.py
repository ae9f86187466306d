"""`pora verify` finds damage where it is; `pora verify --rebuild-index` restores a
lost index from the entry logs and the journal."""

from __future__ import annotations

import shutil
from pathlib import Path

import plyvel
import pytest
import trio
from cli_support import (
    CLOSED_LEDGER,
    CUT_FLUSHED,
    CUT_LEDGER,
    CUT_PENDING,
    ENTRIES_PER_LEDGER,
    FENCED_KEY,
    FENCED_LEDGER,
    LAC_LAG,
    OPEN_LEDGER,
    SEAL_AT,
    SEALED_LEDGER,
    assert_every_ack_readable,
    crashed_copy,
    cut_flush_copy,
    make_data_dir,
    payload,
    run_cli,
)

import pora
from journal.format import RecordKind
from journal.reader import JournalScanner
from ledger.entrylog_format import STATE_ENTRY_ID
from ledger.index import META_PREFIX, Index
from ledger.state import LedgerMeta
from pora.node.datadir import open_data_dir
from pora.tools.inspection import entrylog_path, open_entry_log

Capsys = pytest.CaptureFixture[str]


def _position(data_dir: Path, ledger_id: int, entry_id: int) -> tuple[int, int]:
    with Index(data_dir / "index", create=False) as index:
        position = index.get_position(ledger_id, entry_id)
    assert position is not None
    return position


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0x01]))


def _log_path(data_dir: Path, ledger_id: int) -> Path:
    return entrylog_path(open_data_dir(data_dir, create=False), ledger_id)


def test_verify_passes_on_a_data_dir_the_engine_made(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    result = run_cli(capsys, "verify", "--json", "--data-dir", str(data_dir))
    assert result.status == 0, result.out
    report = result.json()
    assert report["ok"] is True
    assert report["problems"] == []
    assert report["ledgers"] == 4
    assert report["entries"] == 4 * ENTRIES_PER_LEDGER
    table = run_cli(capsys, "verify", "--data-dir", str(data_dir))
    assert table.status == 0
    assert "result: OK" in table.out
    assert f"entries          {report['entries']}" in table.out


def test_positions_of_a_ledger_without_metadata_are_reported_with_a_count(
    data_dir: Path, capsys: Capsys
) -> None:
    make_data_dir(data_dir)
    orphan_ledger = 9_999
    with Index(data_dir / "index", create=False) as index:
        positions = [(entry_id, 64 + entry_id * 100, 100) for entry_id in range(3)]
        index.apply_flush(orphan_ledger, positions, LedgerMeta(orphan_ledger), sync=True)
    # lose the metadata only, as a damaged index or a half-done delete might
    db = plyvel.DB(str(data_dir / "index"), create_if_missing=False)
    try:
        db.delete(META_PREFIX + orphan_ledger.to_bytes(8, "big"), sync=True)
    finally:
        db.close()

    result = run_cli(capsys, "verify", "--json", "--data-dir", str(data_dir))

    assert result.status == 1
    report = result.json()
    assert report["ok"] is False
    orphans = [p for p in report["problems"] if p["kind"] == "orphan-positions"]
    assert len(orphans) == 1, report["problems"]
    assert orphans[0]["ledger_id"] == orphan_ledger
    assert "3 entry positions" in orphans[0]["message"]
    assert "--rebuild-index" in orphans[0]["message"]
    # the ledgers that have metadata are still verified and found intact
    assert report["ledgers"] == 4
    assert len(report["problems"]) == 1


def test_a_flipped_byte_is_reported_with_its_ledger_entry_file_and_offset(
    data_dir: Path, capsys: Capsys
) -> None:
    make_data_dir(data_dir)
    offset, record_length = _position(data_dir, CLOSED_LEDGER, 4)
    log = _log_path(data_dir, CLOSED_LEDGER)
    _flip_byte(log, offset + record_length - 1)  # the payload's last byte

    result = run_cli(capsys, "verify", "--json", "--data-dir", str(data_dir))
    assert result.status == 1
    problems = result.json()["problems"]
    assert problems, "the damage must be found"
    assert {(p["ledger_id"], p["entry_id"], p["file"], p["offset"]) for p in problems} == {
        (CLOSED_LEDGER, 4, str(log), offset)
    }
    assert problems[0]["kind"] == "bad-record"
    assert "checksum" in problems[0]["message"]

    table = run_cli(capsys, "verify", "--data-dir", str(data_dir))
    assert table.status == 1
    row = next(line for line in table.out.splitlines() if line.startswith("bad-record"))
    assert row.split()[1:5] == [str(CLOSED_LEDGER), "4", str(log), str(offset)]
    # reading the damaged entry offline fails the same way, naming the place
    read = run_cli(capsys, "ledger", "read", str(CLOSED_LEDGER), "--data-dir", str(data_dir))
    assert read.status == 1
    assert f"{log} at byte {offset}" in read.err


def test_a_lost_index_is_rebuilt_and_every_read_restored(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    before = run_cli(capsys, "ledger", "list", "--json", "--data-dir", str(data_dir)).json()
    for path in (data_dir / "index").iterdir():
        path.unlink()
    (data_dir / "index").rmdir()
    refused = run_cli(capsys, "ledger", "list", "--data-dir", str(data_dir))
    assert refused.status == 1
    assert "pora verify --rebuild-index" in refused.err

    result = run_cli(capsys, "verify", "--rebuild-index", "--json", "--data-dir", str(data_dir))
    assert result.status == 0, result.err
    report = result.json()
    assert report["ledgers"] == 4
    assert report["entries"] == 4 * ENTRIES_PER_LEDGER
    assert report["moved_aside"] is None

    after = run_cli(capsys, "ledger", "list", "--json", "--data-dir", str(data_dir)).json()
    # states (open, closed at the seal, fenced) come back from the logs' state records
    assert after == before
    for ledger_id in (OPEN_LEDGER, SEALED_LEDGER):
        shown = run_cli(
            capsys, "ledger", "show", str(ledger_id), "--json", "--data-dir", str(data_dir)
        ).json()
        assert shown["sealed_last_entry_id"] == (SEAL_AT if ledger_id == SEALED_LEDGER else None)
    assert run_cli(capsys, "verify", "--data-dir", str(data_dir)).status == 0

    async def read_back() -> None:
        async with pora.open_node(data_dir) as node:
            for ledger_id in (OPEN_LEDGER, CLOSED_LEDGER, FENCED_LEDGER):
                for entry_id in range(ENTRIES_PER_LEDGER):
                    got = await node.read_entry(ledger_id, entry_id)
                    assert got == payload(ledger_id, entry_id)
            for entry_id in range(SEAL_AT + 1):
                assert await node.read_entry(SEALED_LEDGER, entry_id) == payload(
                    SEALED_LEDGER, entry_id
                )
            with pytest.raises(pora.NoSuchEntry):
                await node.read_entry(SEALED_LEDGER, SEAL_AT + 1)
            assert node.last_add_confirmed(OPEN_LEDGER) == ENTRIES_PER_LEDGER - 1 - LAC_LAG
            with pytest.raises(pora.LedgerClosed):
                await node.add_entry(CLOSED_LEDGER, ENTRIES_PER_LEDGER, b"late")
            with pytest.raises(pora.LedgerFenced):
                await node.add_entry(
                    FENCED_LEDGER, ENTRIES_PER_LEDGER, b"late", master_key=FENCED_KEY
                )
            # the master key came back too: another key is refused
            with pytest.raises(pora.Unauthorized):
                await node.fence_ledger(FENCED_LEDGER, master_key=b"intruder")

    trio.run(read_back)


def test_a_damaged_index_is_moved_aside_not_deleted(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    for table in (data_dir / "index").glob("*.ldb"):
        table.write_bytes(b"garbage")
    for log in (data_dir / "index").glob("*.log"):
        log.write_bytes(b"garbage")
    kept = sorted(p.name for p in (data_dir / "index").iterdir())
    result = run_cli(capsys, "verify", "--rebuild-index", "--json", "--data-dir", str(data_dir))
    assert result.status == 0, result.err
    moved = Path(result.json()["moved_aside"])
    assert moved.parent == data_dir
    assert moved.name.startswith("index.damaged-")
    assert sorted(p.name for p in moved.iterdir()) == kept
    assert run_cli(capsys, "verify", "--data-dir", str(data_dir)).status == 0


def test_rebuild_after_a_crash_replays_the_journal_too(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: Capsys
) -> None:
    crashed = crashed_copy(tmp_path_factory, tmp_path / "crashed")
    for path in (crashed.data_dir / "index").iterdir():
        path.unlink()
    result = run_cli(
        capsys, "verify", "--rebuild-index", "--json", "--data-dir", str(crashed.data_dir)
    )
    assert result.status == 0, result.err
    assert result.json()["replay"]["records_scanned"] > 0
    assert not list((crashed.data_dir / "journal").glob("*.journal"))
    assert run_cli(capsys, "verify", "--data-dir", str(crashed.data_dir)).status == 0
    assert_every_ack_readable(crashed.data_dir, crashed.acked)


def test_rebuild_indexes_around_a_damaged_record_and_reports_it(
    data_dir: Path, capsys: Capsys
) -> None:
    make_data_dir(data_dir)
    offset, record_length = _position(data_dir, OPEN_LEDGER, 3)
    log = _log_path(data_dir, OPEN_LEDGER)
    _flip_byte(log, offset + 30)
    result = run_cli(capsys, "verify", "--rebuild-index", "--json", "--data-dir", str(data_dir))
    assert result.status == 1
    damage = result.json()["damage"]
    assert damage == [
        {
            "kind": "corruption",
            "ledger_id": OPEN_LEDGER,
            "file": str(log),
            "offset": offset,
            "resumes_at": offset + record_length,
            "reason": "checksum fails or the length cannot be right",
            "claimed_entry_id": 3,
            "claimed_record_length": record_length,
            "superseded": False,
            # the journal was trimmed at the clean shutdown: nothing can bring it back
            "restored": False,
        }
    ]
    table_run = run_cli(capsys, "verify", "--data-dir", str(data_dir), "--json")
    entries = {
        r["entry_id"]
        for r in run_cli(
            capsys, "ledger", "read", str(OPEN_LEDGER), "--json", "--data-dir", str(data_dir)
        ).json_lines()
    }
    assert entries == set(range(ENTRIES_PER_LEDGER)) - {3}
    # verify now finds the damaged record, unindexed, inside the log
    assert table_run.status == 1
    assert any(p["offset"] == offset for p in table_run.json()["problems"])


def test_rebuild_reports_a_corrupt_journal_it_cannot_replay(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: Capsys
) -> None:
    crashed = crashed_copy(tmp_path_factory, tmp_path / "crashed")
    first = next(iter(JournalScanner(crashed.data_dir / "journal").batches()))[0]
    _flip_byte(first.segment, first.offset)
    for path in (crashed.data_dir / "index").iterdir():
        path.unlink()
    result = run_cli(
        capsys, "verify", "--rebuild-index", "--json", "--data-dir", str(crashed.data_dir)
    )
    assert result.status == 1
    report = result.json()
    assert report["ledgers"] > 0
    assert report["replay"] is None
    assert "journal corruption" in report["replay_error"]
    assert "the index was rebuilt, but replaying the journal failed" in result.err
    assert first.segment.exists(), "the journal is kept for the operator"


def _last_state_record(log: Path, ledger_id: int) -> tuple[int, int]:
    with open_entry_log(log, ledger_id) as entry_log:
        states = [
            (r.offset, r.record_length) for r in entry_log.scan() if r.entry_id == STATE_ENTRY_ID
        ]
    return states[-1]


def test_rebuild_flags_a_damaged_last_state_record_it_cannot_restore(
    data_dir: Path, capsys: Capsys
) -> None:
    make_data_dir(data_dir)
    log = _log_path(data_dir, CLOSED_LEDGER)
    offset, record_length = _last_state_record(log, CLOSED_LEDGER)
    _flip_byte(log, offset + record_length - 1)
    shutil.rmtree(data_dir / "index")
    result = run_cli(capsys, "verify", "--rebuild-index", "--data-dir", str(data_dir))
    assert result.status == 1
    assert f"DAMAGED: ledger {CLOSED_LEDGER}: {log} at byte {offset}: a state record" in result.out


@pytest.mark.parametrize("after_torn", ["nothing", "intact-records"])
def test_rebuild_after_a_torn_flush_restores_it_from_the_journal(
    tmp_path: Path, capsys: Capsys, after_torn: str
) -> None:
    data_dir = cut_flush_copy(tmp_path / "live", tmp_path / "crashed")
    with Index(data_dir / "index", create=False) as index:
        meta = index.get_meta(CUT_LEDGER)
    assert meta is not None and meta.last_entry_id == CUT_FLUSHED - 1
    # a journal body is byte for byte an entry-log record
    bodies = {
        record.entry_id: record.body
        for batch in JournalScanner(data_dir / "journal").batches()
        for record in batch
        if record.kind is RecordKind.ENTRY and record.ledger_id == CUT_LEDGER
    }
    # the flush of the pending entries was cut by the crash: the last page of its
    # first record never reached the disk; with "intact-records", the pages after it
    # did (writeback order is the kernel's)
    torn = bytearray(bodies[CUT_FLUSHED])
    torn[-1] ^= 0xFF
    written = bytes(torn)
    if after_torn == "intact-records":
        written += bodies[CUT_FLUSHED + 1]
    with open(_log_path(data_dir, CUT_LEDGER), "r+b") as file:
        file.seek(meta.log_end)
        file.write(written)
    shutil.rmtree(data_dir / "index")

    result = run_cli(capsys, "verify", "--rebuild-index", "--json", "--data-dir", str(data_dir))
    assert result.status == 0, result.out + result.err
    report = result.json()
    assert report["ok"] is True
    assert [(d["offset"], d["claimed_entry_id"], d["restored"]) for d in report["damage"]] == [
        (meta.log_end, CUT_FLUSHED, True)
    ]
    verified = run_cli(capsys, "verify", "--json", "--data-dir", str(data_dir))
    assert verified.status == 0, verified.out
    if after_torn == "intact-records":  # the damaged copy stays in the log, noted
        assert any(
            f"damaged copy of entry {CUT_FLUSHED} at byte {meta.log_end}" in note
            for note in verified.json()["notes"]
        )
    acked = frozenset((CUT_LEDGER, e) for e in range(CUT_FLUSHED + CUT_PENDING))
    trio.run(_read_payloads, data_dir, acked)


async def _read_payloads(data_dir: Path, entries: frozenset[tuple[int, int]]) -> None:
    async with pora.open_node(data_dir) as node:
        for ledger_id, entry_id in sorted(entries):
            assert await node.read_entry(ledger_id, entry_id) == payload(ledger_id, entry_id)
