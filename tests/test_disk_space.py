"""Room for the journal: a node refuses to start, saying how much is free and needed
where, rather than die preallocating a segment; and a journal that fails on a full
disk says so in the log, once, with what to do.

Real small ext4 filesystems (tests/fs_faults.py), mounted on the data dir or on one
of its folders.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from fs_faults import SmallFilesystems, fill

import journal.task
import pora
from journal.errors import JournalError, JournalNoSpace
from journal.request import Request
from journal.spares import SPARE_SUFFIX
from journal.task import GroupCommitConfig, Journal

MIB = 1 << 20


async def _dispatch(group: list[Request]) -> None:
    for request in group:
        request.complete()


def test_a_node_refuses_to_start_without_room_for_a_segment(
    tmp_path: Path, small_filesystems: SmallFilesystems
) -> None:
    """The whole data dir on a 16 MiB filesystem; the default segment is 256 MiB."""
    data_dir = small_filesystems.mount(tmp_path / "pora-data", 16)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
         "--listen", "127.0.0.1:0", "--log-format", "logfmt"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    # refused before any work: the interpreter's start-up and a statvfs; bounded at half
    # the 60 s hang guard so that a loaded machine's slow start cannot fail the test
    assert time.monotonic() - started < 30
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "level=error" in line]
    assert f"journal/ ({data_dir / 'journal'}) on /dev/loop" in line
    assert "MiB free; the journal needs 256.0 MiB (one segment of segment_bytes=268435456)" in line
    assert "free space on that filesystem, or lower segment_bytes" in line
    assert not list((data_dir / "journal").glob("*.journal"))  # nothing half made


async def test_the_check_wants_one_segment_or_a_spare_left_by_the_last_run(
    tmp_path: Path, small_filesystems: SmallFilesystems
) -> None:
    directory = small_filesystems.mount(tmp_path / "journal", 16)
    config = GroupCommitConfig(segment_bytes=8 * MIB, spare_segments_max=1)
    fill(directory, 6 * MIB)
    journal = Journal(directory, config, first_seq=0, dispatch=_dispatch)
    with pytest.raises(JournalNoSpace, match=r"the journal needs 8\.0 MiB"), trio.fail_after(10):
        await journal.run()
    # a spare left by the last run becomes the first segment: no more room needed
    (directory / "filler").unlink()
    (directory / f"spare-1-0{SPARE_SUFFIX}").write_bytes(bytes(8 * MIB))
    fill(directory, 1 * MIB)
    journal = Journal(directory, config, first_seq=0, dispatch=_dispatch)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        journal.close_input()


async def test_enospc_while_preallocating_is_the_same_refusal(
    tmp_path: Path, small_filesystems: SmallFilesystems, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The space goes between the check and the preallocation (another writer)."""
    directory = small_filesystems.mount(tmp_path / "journal", 16)
    fill(directory, 2 * MIB)
    monkeypatch.setattr(journal.task, "free_bytes", lambda _path: 1 << 40)
    config = GroupCommitConfig(segment_bytes=8 * MIB, spare_segments_max=0)
    journal_ = Journal(directory, config, first_seq=0, dispatch=_dispatch)
    with pytest.raises(JournalNoSpace, match=r"journal/ .* on /dev/loop\d+ has"):
        with trio.fail_after(10):
            await journal_.run()
    assert not list(directory.glob("*.journal"))


async def test_a_journal_failure_is_logged_once_with_the_cause_and_what_to_do(
    tmp_path: Path, small_filesystems: SmallFilesystems, caplog: pytest.LogCaptureFixture
) -> None:
    """A node whose journal/ is on its own small filesystem, which fills up."""
    data_dir = tmp_path / "pora-data"
    options: dict[str, Any] = {
        "segment_bytes": 1 * MIB,
        "spare_segments_max": 0,
        "recycle_segments": False,
    }
    async with pora.open_node(data_dir, **options):
        pass  # a data dir whose journal/ holds only its watermark, to move onto a filesystem
    journal_dir = small_filesystems.mount(data_dir / "journal", 8, move_contents=True)
    async with pora.open_node(data_dir, **options) as node:
        await node.add_entry(1, 0, b"kept")
        fill(journal_dir, 0)
        errors: list[BaseException] = []
        for entry_id in range(1, 40):
            try:
                await node.add_entry(1, entry_id, bytes(256 << 10))
            except JournalError as error:
                errors.append(error)
        assert errors
        assert await node.read_entry(1, 0) == b"kept"  # reads go on
        failures = [
            r for r in caplog.records if r.name == "pora.journal" and r.levelno == logging.ERROR
        ]
        assert len(failures) == 1, [r.getMessage() for r in failures]
        message = failures[0].getMessage()
        assert f"journal write failed in {journal_dir} (No space left on device)" in message
        assert "refuses every add, fence and close from now on" in message
        assert "Free space on /dev/loop" in message
        assert "then restart the node" in message


async def test_a_start_with_room_is_not_refused(tmp_path: Path) -> None:
    async with pora.open_node(tmp_path / "pora-data", segment_bytes=1 * MIB) as node:
        await node.add_entry(1, 0, b"fine")
    # preallocation off: segments grow as written, nothing to reserve
    config = GroupCommitConfig(segment_bytes=1 << 40, preallocate=False)
    journal_ = Journal(tmp_path / "j", config, first_seq=0, dispatch=_dispatch)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal_.run)
        journal_.close_input()


def test_a_full_disk_met_while_making_the_data_dir_is_said_plainly(
    tmp_path: Path, small_filesystems: SmallFilesystems
) -> None:
    mounted = small_filesystems.mount(tmp_path / "disk", 16)
    fill(mounted, 0)
    for number in range(10_000):  # the last blocks, which the filler's big writes leave
        try:
            (mounted / f"crumb-{number}").write_bytes(b"x" * 1024)
        except OSError:
            break
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(mounted / "pora-data"),
         "--listen", "127.0.0.1:0", "--log-format", "logfmt"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "level=error" in line]
    assert "No space left on device on " in line
    assert "free space on that filesystem, then start again" in line
