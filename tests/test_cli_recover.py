"""`pora recover` after a SIGKILLed writer, and what every command refuses to touch."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from cli_support import (
    acked_payload,
    assert_every_ack_readable,
    crashed_copy,
    make_data_dir,
    run_cli,
)
from crash_support import ROOT, start_writer

import pora
from pora.cli import main
from pora.node.datadir import MARKER_NAME

Capsys = pytest.CaptureFixture[str]

#: one invocation of each command, with the data dir to be appended
EVERY_COMMAND = [
    ["recover"],
    ["recover", "--dry-run"],
    ["journal", "dump"],
    ["journal", "verify"],
    ["ledger", "list"],
    ["ledger", "show", "7"],
    ["ledger", "read", "7"],
    ["verify"],
    ["verify", "--rebuild-index"],
]


def _tree_digest(root: Path) -> dict[str, str]:
    digests = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name not in {"LOCK", "LOG", "LOG.old"}:
            digests[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


@pytest.mark.slow  # a writer process to start and SIGKILL: 2-3 s
def test_recover_replays_what_a_sigkilled_writer_acknowledged(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, capsys: Capsys
) -> None:
    crashed = crashed_copy(tmp_path_factory, tmp_path / "crashed")
    directory = str(crashed.data_dir)
    journal_before = _tree_digest(crashed.data_dir / "journal")

    dry = run_cli(capsys, "recover", "--dry-run", "--json", "--data-dir", directory)
    assert dry.status == 0
    planned = dry.json()
    assert planned["dry_run"] is True
    assert planned["records_replayed"] > 0
    assert _tree_digest(crashed.data_dir / "journal") == journal_before, "dry run wrote"

    done = run_cli(capsys, "recover", "--json", "--data-dir", directory)
    assert done.status == 0
    report = done.json()
    # the dry run predicted exactly what the node's own recovery did
    for key in ("segments", "records_scanned", "records_replayed", "bytes_replayed"):
        assert report[key] == planned[key], key
    assert report["ledgers_touched"] == planned["ledgers_touched"]
    assert report["segments_trimmed"] == report["segments"]
    assert not list((crashed.data_dir / "journal").glob("*.journal"))

    again = run_cli(capsys, "recover", "--json", "--data-dir", directory)
    assert again.status == 0
    assert again.json()["records_replayed"] == 0

    # offline reads now give every acknowledged entry, and so does a node
    listing = run_cli(capsys, "ledger", "list", "--json", "--data-dir", directory).json()
    assert listing["unreplayed_journal_records"] == {}
    last = {row["ledger_id"]: row["last_entry_id"] for row in listing["ledgers"]}
    for ledger_id, entry_id in crashed.acked:
        assert last[ledger_id] >= entry_id
    for ledger_id in sorted({ledger_id for ledger_id, _ in crashed.acked}):
        read = run_cli(capsys, "ledger", "read", str(ledger_id), "--json", "--data-dir", directory)
        assert read.status == 0
        stored = {r["entry_id"]: base64.b64decode(r["payload_base64"]) for r in read.json_lines()}
        for acked_ledger, entry_id in crashed.acked:
            if acked_ledger == ledger_id:
                assert stored[entry_id] == acked_payload(ledger_id, entry_id)
    assert_every_ack_readable(crashed.data_dir, crashed.acked)


def test_recover_table_matches_json(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    as_json = run_cli(capsys, "recover", "--dry-run", "--json", "--data-dir", str(data_dir))
    table = run_cli(capsys, "recover", "--dry-run", "--data-dir", str(data_dir))
    assert as_json.status == table.status == 0
    assert f"records to replay  {as_json.json()['records_replayed']} (" in table.out


def test_recover_refuses_a_lost_index_next_to_entry_logs(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    for path in sorted((data_dir / "index").iterdir()):
        path.unlink()
    (data_dir / "index").rmdir()
    result = run_cli(capsys, "recover", "--data-dir", str(data_dir))
    assert result.status == 1
    assert "pora verify --rebuild-index" in result.err
    assert not (data_dir / "index").exists(), "recover must not create an empty index"


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=" ".join)
def test_every_command_refuses_a_dir_an_open_node_holds(
    command: list[str], data_dir: Path, capsys: Capsys
) -> None:
    make_data_dir(data_dir)
    before = _tree_digest(data_dir / "ledgers")

    async def attempt() -> int:
        async with pora.open_node(data_dir):
            # the node runs on this thread's event loop; the command runs beside it
            return await trio.to_thread.run_sync(main, [*command, "--data-dir", str(data_dir)])

    status = trio.run(attempt)
    err = capsys.readouterr().err
    assert status == 2
    assert "in use by another Pora process" in err
    assert f"pid {os.getpid()}" in err
    assert _tree_digest(data_dir / "ledgers") == before


def test_a_dir_held_by_a_writer_process_is_refused(tmp_path: Path, capsys: Capsys) -> None:
    data_dir = tmp_path / "pora-data"
    child = start_writer(data_dir)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        result = run_cli(capsys, "recover", "--data-dir", str(data_dir))
        assert result.status == 2
        assert f"pid {child.pid}" in result.err
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


@pytest.mark.parametrize("command", EVERY_COMMAND, ids=" ".join)
def test_every_command_refuses_what_is_not_a_pora_data_dir(
    command: list[str], tmp_path: Path, capsys: Capsys
) -> None:
    not_ours = tmp_path / "home"
    not_ours.mkdir()
    (not_ours / "notes.txt").write_text("precious")
    missing = tmp_path / "missing"
    for root in (not_ours, missing):
        result = run_cli(capsys, *command, "--data-dir", str(root))
        assert result.status == 2
        assert "is not a Pora data dir" in result.err
    assert sorted(p.name for p in not_ours.iterdir()) == ["notes.txt"]
    assert not missing.exists()


def test_an_unknown_format_version_is_refused(data_dir: Path, capsys: Capsys) -> None:
    make_data_dir(data_dir)
    marker = data_dir / MARKER_NAME
    info = json.loads(marker.read_text())
    info["version"] = 99
    marker.write_text(json.dumps(info))
    for command in EVERY_COMMAND:
        result = run_cli(capsys, *command, "--data-dir", str(data_dir))
        assert result.status == 2, command
        assert "format version 99" in result.err


def test_the_installed_command_runs_as_a_process(data_dir: Path) -> None:
    make_data_dir(data_dir)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "ledger", "list", "--json", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["ledgers"]) == 4
    refused = subprocess.run(
        [sys.executable, "-m", "pora.cli", "verify", "--data-dir", str(data_dir / "nope")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert refused.returncode == 2
    assert "is not a Pora data dir" in refused.stderr


@pytest.mark.parametrize(
    "command",
    [["recover"], ["journal", "dump"], ["journal", "verify"], ["ledger", "list"],
     ["ledger", "show"], ["ledger", "read"], ["verify"]],
    ids=" ".join,
)  # fmt: skip
def test_every_command_explains_itself(command: list[str], capsys: Capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--data-dir" in out
    assert "--json" in out


def test_recover_shows_replay_progress_with_rate_and_eta(
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    capsys: Capsys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crashed = crashed_copy(tmp_path_factory, tmp_path / "crashed")
    # report on every update, so that even a short replay draws its bar
    monkeypatch.setattr("pora.tools.progress.PLAIN_INTERVAL_S", 0.0)

    done = run_cli(capsys, "recover", "--data-dir", str(crashed.data_dir))

    assert done.status == 0
    lines = [line for line in done.err.splitlines() if line.startswith("replaying journal")]
    assert lines, done.err
    assert "(total estimated from segment sizes)" in lines[0]
    # a real bar: bytes done of a total, a rate, and the time left while under way
    assert " of " in lines[0]
    assert "/s," in lines[0]
    assert "ETA" in lines[0] or "elapsed" in lines[0]
    assert "100.0%" in lines[-1]
