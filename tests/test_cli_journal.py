"""`pora journal dump` and `pora journal verify` on journals left by a SIGKILLed writer,
torn at the tail, and corrupted in the middle."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import trio
from cli_support import crashed_copy, end_of_journal_data, run_cli, write_and_abandon

import pora
from journal.format import BATCH_HEADER_SIZE, BLOCK_SIZE, RECORD_HEADER_SIZE
from journal.reader import JournalScanner
from journal.segment import list_segments

Capsys = pytest.CaptureFixture[str]


def test_dump_lists_the_records_in_seq_order_with_filters(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: Capsys
) -> None:
    crashed = crashed_copy(tmp_path_factory, tmp_path / "crashed")
    directory = str(crashed.data_dir)
    result = run_cli(capsys, "journal", "dump", "--json", "--data-dir", directory)
    assert result.status == 0
    *records, summary = result.json_lines()
    assert records
    seqs = [r["seq"] for r in records]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert all(r["checksum"] == "ok" for r in records)
    assert summary["summary"]["records"] == len(records)
    expected = [
        (r.seq, r.ledger_id, r.entry_id, len(r.payload))
        for batch in JournalScanner(crashed.data_dir / "journal").batches()
        for r in batch
    ]
    assert [(r["seq"], r["ledger"], r["entry"], r["size"]) for r in records] == expected

    ledger_id = records[0]["ledger"]
    low, high = seqs[len(seqs) // 4], seqs[len(seqs) // 2]
    filtered = run_cli(
        capsys, "journal", "dump", "--json", "--ledger", str(ledger_id),
        "--from-seq", str(low), "--to-seq", str(high), "--data-dir", directory,
    ).json_lines()[:-1]  # fmt: skip
    assert filtered == [r for r in records if r["ledger"] == ledger_id and low <= r["seq"] <= high]

    table = run_cli(capsys, "journal", "dump", "--data-dir", directory)
    header, *lines = table.out.splitlines()
    # the crash may have cut a group commit short: the table then ends with that line
    torn = summary["summary"]["torn_tail"]
    if torn is not None:
        assert lines.pop() == f"-- torn tail: {torn['message']}"
    columns = header.split()
    assert columns == list(records[0])
    assert [dict(zip(columns, line.split(), strict=True)) for line in lines] == [
        {k: str(v) for k, v in r.items()} for r in records
    ]


def test_verify_reports_a_torn_tail_and_succeeds(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: Capsys
) -> None:
    crashed = crashed_copy(tmp_path_factory, tmp_path / "crashed")
    last, end = end_of_journal_data(crashed.data_dir / "journal")
    with open(last, "r+b") as file:  # a group commit cut short by the crash
        file.seek(end)
        file.write(b"\x5a" * 700)
    result = run_cli(capsys, "journal", "verify", "--json", "--data-dir", str(crashed.data_dir))
    assert result.status == 0
    report = result.json()
    assert report["ok"] is True
    assert report["torn_tail"]["segment"] == str(last)
    assert report["torn_tail"]["offset"] == end
    table = run_cli(capsys, "journal", "verify", "--data-dir", str(crashed.data_dir))
    assert table.status == 0
    assert f"at byte {end}" in table.out
    assert re.search(r"^result +OK$", table.out, re.MULTILINE)
    # recovery ends there too, and says so
    recovered = run_cli(capsys, "recover", "--json", "--data-dir", str(crashed.data_dir))
    assert recovered.status == 0
    assert recovered.json()["torn_tail"]["offset"] == end


def test_verify_reports_corruption_with_segment_and_offset(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: Capsys
) -> None:
    crashed = crashed_copy(tmp_path_factory, tmp_path / "crashed")
    batches = list(JournalScanner(crashed.data_dir / "journal").batches())
    assert len(batches) >= 2
    first = batches[0][0]
    # damage with valid batches after it (in this segment or later ones) is corruption
    with open(first.segment, "r+b") as file:
        file.seek(first.offset)
        byte = file.read(1)
        file.seek(first.offset)
        file.write(bytes([byte[0] ^ 0xFF]))
    result = run_cli(capsys, "journal", "verify", "--json", "--data-dir", str(crashed.data_dir))
    assert result.status == 1
    problem = result.json()["problem"]
    assert problem["kind"] == "corruption"
    assert problem["segment"] == str(first.segment)
    assert problem["offset"] < first.offset + BLOCK_SIZE
    assert problem["offset"] % BLOCK_SIZE == 0
    table = run_cli(capsys, "journal", "verify", "--data-dir", str(crashed.data_dir))
    assert table.status == 1
    assert f"CORRUPTION: {first.segment} at byte {problem['offset']}" in table.out
    # dump prints what precedes the damage, then fails with the place
    dump = run_cli(capsys, "journal", "dump", "--data-dir", str(crashed.data_dir))
    assert dump.status == 1
    assert f"{first.segment} at byte {problem['offset']}" in dump.err
    # and recovery refuses to skip it
    recover = run_cli(capsys, "recover", "--data-dir", str(crashed.data_dir))
    assert recover.status == 1
    assert "journal corruption" in recover.err


async def test_verify_counts_a_run_of_entries_as_one_record(tmp_path: Path, capsys: Capsys) -> None:
    data_dir = tmp_path / "data"
    async with pora.open_node(data_dir) as node:
        # one run of 10 entries (one record, after the ledger's KEY record), then a
        # single add to another ledger (a KEY record and an entry record)
        outcomes = await node.add_entries([(1, i, b"x" * 100) for i in range(10)])
        assert outcomes == [None] * 10
        await node.add_entry(2, 0, b"y")
        # a copy while the node runs: the journal as a crash would leave it (a clean
        # close flushes the ledgers and trims the journal)
        shutil.copytree(data_dir, tmp_path / "copy")
    data_dir = tmp_path / "copy"
    result = run_cli(capsys, "journal", "verify", "--json", "--data-dir", str(data_dir))
    assert result.status == 0
    report = result.json()
    assert report["records"] == 4
    assert sum(report["segment_records"].values()) == 4
    dumped = run_cli(capsys, "journal", "dump", "--json", "--data-dir", str(data_dir))
    entries = [line for line in dumped.json_lines()[:-1] if line["type"] == "entry"]
    # dump shows every entry, those of the run under the run's seq
    assert [(e["ledger"], e["entry"]) for e in entries] == [(1, i) for i in range(10)] + [(2, 0)]
    assert len({e["seq"] for e in entries}) == 2


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0x01]))


def test_a_flipped_byte_in_the_last_batch_is_not_called_unacknowledged(
    data_dir: Path, capsys: Capsys, caplog: pytest.LogCaptureFixture
) -> None:
    """A flipped bit in the last batch and a write cut by a crash look alike: the tools
    say which records they dropped and why, never that they were not acknowledged."""
    trio.run(lambda: write_and_abandon(data_dir, 1, trim_first=False, last_batch_ledgers=4))
    batches = list(JournalScanner(data_dir / "journal").batches())
    last = batches[-1]
    first_seq, records = last[0].seq, last[-1].seq - last[0].seq + 1
    assert records == 8  # a KEY and an ENTRY record per ledger: one group commit
    path, batch_offset = last[0].segment, last[0].offset - BATCH_HEADER_SIZE
    _flip_byte(path, last[-1].offset + RECORD_HEADER_SIZE + 10)  # the last payload

    result = run_cli(capsys, "journal", "verify", "--json", "--data-dir", str(data_dir))
    assert result.status == 0
    report = result.json()
    assert report["ok"] is True
    assert (report["records_dropped"], report["dropped_because"]) == (
        records,
        "torn tail: checksum mismatch",
    )
    torn = report["torn_tail"]
    assert (torn["kind"], torn["records_dropped"], torn["first_seq_dropped"]) == (
        "checksum",
        records,
        first_seq,
    )
    expected = (
        f"the last batch at byte {batch_offset} of {path} fails its checksum: a write cut by "
        "a crash, or damaged media"
    )
    dropped = f"{records} record(s), seqs {first_seq}-{first_seq + records - 1}, were not replayed"
    assert torn["message"].startswith(expected) and torn["message"].endswith(dropped)
    table = run_cli(capsys, "journal", "verify", "--data-dir", str(data_dir))
    assert table.status == 0
    assert re.search(
        rf"^records dropped +{records} \(torn tail: checksum mismatch\)$", table.out, re.M
    )
    assert expected in table.out and "never acknowledged" not in table.out

    recovered = run_cli(capsys, "recover", "--data-dir", str(data_dir))
    assert recovered.status == 0
    assert expected in recovered.out and "never acknowledged" not in recovered.out
    warnings = [r.getMessage() for r in caplog.records if r.name == "pora.replay"]
    assert len(warnings) == 1 and expected in warnings[0] and dropped in warnings[0]
    assert "never acknowledged" not in warnings[0]


def test_verify_counts_every_segment_after_corruption_in_the_first(
    data_dir: Path, capsys: Capsys
) -> None:
    trio.run(lambda: write_and_abandon(data_dir, 3, trim_first=False))
    segments = list_segments(data_dir / "journal")
    assert len(segments) == 3
    first_record = next(iter(JournalScanner(data_dir / "journal").batches()))[0]
    assert first_record.segment == segments[0].path
    _flip_byte(first_record.segment, first_record.offset + RECORD_HEADER_SIZE + 10)
    result = run_cli(capsys, "journal", "verify", "--json", "--data-dir", str(data_dir))
    assert result.status == 1
    report = result.json()
    assert report["problem"]["kind"] == "corruption"
    assert report["segments"] == 3
    table = run_cli(capsys, "journal", "verify", "--data-dir", str(data_dir))
    assert re.search(r"^segments +3$", table.out, re.MULTILINE)
