"""`pora ledger list | show | read` on data dirs made by the engine."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from cli_support import (
    CLOSED_LEDGER,
    ENTRIES_PER_LEDGER,
    FENCED_LEDGER,
    OPEN_LEDGER,
    SEAL_AT,
    SEALED_LEDGER,
    crashed_copy,
    make_data_dir,
    payload,
    run_cli,
)

Capsys = pytest.CaptureFixture[str]


def test_list_shows_each_ledger_state_and_figures(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    result = run_cli(capsys, "ledger", "list", "--data-dir", str(data_dir), "--json")
    assert result.status == 0
    rows = {row["ledger_id"]: row for row in result.json()["ledgers"]}
    assert sorted(rows) == [OPEN_LEDGER, CLOSED_LEDGER, FENCED_LEDGER, SEALED_LEDGER]
    assert rows[OPEN_LEDGER]["state"] == "open"
    assert rows[CLOSED_LEDGER]["state"] == "closed"
    assert rows[FENCED_LEDGER]["state"] == "fenced"
    assert rows[SEALED_LEDGER]["last_entry_id"] == SEAL_AT
    expected_bytes = sum(len(payload(OPEN_LEDGER, e)) for e in range(ENTRIES_PER_LEDGER))
    assert rows[OPEN_LEDGER]["payload_bytes"] == expected_bytes
    assert rows[OPEN_LEDGER]["entry_count"] == ENTRIES_PER_LEDGER
    assert (rows[OPEN_LEDGER]["first_entry_id"], rows[OPEN_LEDGER]["last_entry_id"]) == (
        0,
        ENTRIES_PER_LEDGER - 1,
    )


def test_list_table_matches_json(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    as_json = run_cli(capsys, "ledger", "list", "--data-dir", str(data_dir), "--json").json()
    table = run_cli(capsys, "ledger", "list", "--data-dir", str(data_dir))
    assert table.status == 0
    header, *lines = table.out.splitlines()
    columns = header.split()
    assert columns == list(as_json["ledgers"][0])
    parsed = [dict(zip(columns, line.split(), strict=True)) for line in lines]
    expected = [{k: str(v) for k, v in row.items()} for row in as_json["ledgers"]]
    assert parsed == expected


def test_show_prints_the_metadata(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    result = run_cli(
        capsys, "ledger", "show", str(SEALED_LEDGER), "--data-dir", str(data_dir), "--json"
    )
    assert result.status == 0
    details = result.json()
    assert details["state"] == "closed"
    assert details["sealed_last_entry_id"] == SEAL_AT
    assert details["stored_last_entry_id"] == ENTRIES_PER_LEDGER - 1
    assert details["indexed_entries"] == ENTRIES_PER_LEDGER
    assert details["unreplayed_journal_records"] == 0
    table = run_cli(capsys, "ledger", "show", str(SEALED_LEDGER), "--data-dir", str(data_dir))
    fields = dict(line.split(None, 1) for line in table.out.splitlines())
    assert fields["sealed_last_entry_id"] == str(SEAL_AT)
    assert fields["state"] == "closed"


def test_show_of_an_unknown_ledger_fails(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    result = run_cli(capsys, "ledger", "show", "12345", "--data-dir", str(data_dir))
    assert result.status == 1
    assert "ledger 12345 is not in the index" in result.err


def test_read_gives_the_entries_as_hex_json_and_raw(
    data_dir: Path, tmp_path: Path, capsys: Capsys
) -> None:
    make_data_dir(data_dir)
    hex_out = run_cli(
        capsys, "ledger", "read", str(OPEN_LEDGER), "--from", "3", "--to", "6",
        "--data-dir", str(data_dir),
    )  # fmt: skip
    assert hex_out.status == 0
    lines = [line.split("\t") for line in hex_out.out.splitlines()]
    assert [int(entry) for entry, _, _ in lines] == [3, 4, 5, 6]
    for entry, size, data in lines:
        assert bytes.fromhex(data) == payload(OPEN_LEDGER, int(entry))
        assert int(size) == len(payload(OPEN_LEDGER, int(entry)))

    json_out = run_cli(
        capsys, "ledger", "read", str(OPEN_LEDGER), "--json", "--data-dir", str(data_dir)
    )
    records = json_out.json_lines()
    assert [r["entry_id"] for r in records] == list(range(ENTRIES_PER_LEDGER))
    for record in records:
        assert base64.b64decode(record["payload_base64"]) == payload(
            OPEN_LEDGER, record["entry_id"]
        )

    raw_file = tmp_path / "entries.bin"
    raw = run_cli(
        capsys, "ledger", "read", str(OPEN_LEDGER), "--from", "2", "--to", "2",
        "--raw", str(raw_file), "--data-dir", str(data_dir),
    )  # fmt: skip
    assert raw.status == 0
    assert raw_file.read_bytes() == payload(OPEN_LEDGER, 2)


def test_read_of_a_closed_ledger_stops_at_its_seal(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    result = run_cli(
        capsys, "ledger", "read", str(SEALED_LEDGER), "--json", "--data-dir", str(data_dir)
    )
    assert result.status == 0
    assert [r["entry_id"] for r in result.json_lines()] == list(range(SEAL_AT + 1))


def test_read_refuses_while_the_journal_holds_unreplayed_records(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: Capsys
) -> None:
    crashed = crashed_copy(tmp_path_factory, tmp_path / "crashed")
    listing = run_cli(capsys, "ledger", "list", "--json", "--data-dir", str(crashed.data_dir))
    assert listing.status == 0
    pending = listing.json()["unreplayed_journal_records"]
    assert pending, "a SIGKILLed writer leaves records in the journal"
    assert "run `pora recover` first" in listing.err
    ledger_id = next(iter(pending))
    refused = run_cli(capsys, "ledger", "read", ledger_id, "--data-dir", str(crashed.data_dir))
    assert refused.status == 1
    assert "not yet replayed" in refused.err
    assert "pora recover" in refused.err
    stale = run_cli(
        capsys, "ledger", "read", ledger_id, "--allow-stale", "--data-dir", str(crashed.data_dir)
    )
    assert stale.status == 0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--from", str(2**63)], f"--from {2**63} is out of range: ids are in 0..{2**63 - 1}"),
        (["--to", str(2**64)], f"--to {2**64} is out of range"),
        (["--from", "-1"], "--from -1 is out of range"),
    ],
)
def test_read_refuses_ids_no_entry_can_have(
    argv: list[str], expected: str, data_dir: Path, capsys: Capsys
) -> None:
    make_data_dir(data_dir)
    result = run_cli(capsys, "ledger", "read", str(OPEN_LEDGER), *argv, "--data-dir", str(data_dir))
    assert (result.status, result.out) == (2, "")
    assert expected in result.err
    result = run_cli(capsys, "ledger", "show", str(2**63), "--data-dir", str(data_dir))
    assert result.status == 2
    assert f"ledger id {2**63} is out of range" in result.err


def test_read_raw_to_a_missing_folder_or_a_directory_is_refused(
    data_dir: Path, tmp_path: Path, capsys: Capsys
) -> None:
    make_data_dir(data_dir)
    missing = tmp_path / "no-such-folder" / "out.bin"
    result = run_cli(
        capsys, "ledger", "read", str(OPEN_LEDGER), "--raw", str(missing),
        "--data-dir", str(data_dir),
    )  # fmt: skip
    assert result.status == 2
    assert f"the folder {missing.parent} does not exist; create it first" in result.err
    result = run_cli(
        capsys, "ledger", "read", str(OPEN_LEDGER), "--raw", str(tmp_path),
        "--data-dir", str(data_dir),
    )  # fmt: skip
    assert result.status == 2
    assert f"--raw {tmp_path} is a directory; give a file name" in result.err
