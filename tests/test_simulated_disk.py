"""The simulation's disk (tests/simulation/disk.py), which the simulation's crashes
rely on: what was synced stays, what was not is lost (or torn), a failing disk
fails with the errno asked for, and the node's files reach it through the storage
seam (journal/fileio.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from simulation.disk import SimDisk, SyncJob

from journal import fileio


def write_file(path: Path, chunks: list[bytes], disk: SimDisk, sync_after: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        offset = 0
        for index, chunk in enumerate(chunks):
            fileio.pwrite_all(fd, chunk, offset)
            offset += len(chunk)
            if index + 1 == sync_after:
                fileio.fdatasync(fd)
    finally:
        os.close(fd)


def test_a_crash_keeps_what_was_synced_and_loses_the_rest_or_tears_it(tmp_path: Path) -> None:
    outcomes = set()
    for seed in range(12):
        root = tmp_path / f"node-{seed}"
        root.mkdir()
        disk = SimDisk(seed)
        with fileio.use_file_calls(disk):
            write_file(root / "log", [b"a" * 100, b"b" * 100, b"c" * 100], disk, sync_after=1)
        disk.crash(root)
        disk.lose_unsynced(root)
        data = (root / "log").read_bytes()
        assert data[:100] == b"a" * 100, "a synced write was lost"
        # what is left past the synced part is a prefix of what was written after it
        assert (b"b" * 100 + b"c" * 100).startswith(data[100:])
        outcomes.add("torn" if len(data) > 100 else "reverted")
    assert outcomes == {"torn", "reverted"}


def test_a_sync_in_a_thread_that_only_synced_is_durable_once_settled(tmp_path: Path) -> None:
    disk = SimDisk(0)
    path = tmp_path / "journal"
    with fileio.use_file_calls(disk):
        write_file(path, [b"x" * 64], disk, sync_after=0)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        job = SyncJob()
        with disk.in_job(job):  # as the journal's sync thread does
            fileio.fdatasync(fd)
        os.close(fd)
    disk.crash(tmp_path)
    assert not disk.settle(job), "a sync its node's crash overtook counted as durable"
    disk.lose_unsynced(tmp_path)
    assert len(path.read_bytes()) < 64, "the crash kept the whole unsettled write"


@pytest.mark.parametrize(("code", "calls"), [(errno.ENOSPC, ["write"]), (errno.EIO, ["sync"])])
def test_a_failing_disk_fails_the_calls_asked_for(
    tmp_path: Path, code: int, calls: list[str]
) -> None:
    disk = SimDisk(0)
    disk.fail(tmp_path, code, calls)
    with fileio.use_file_calls(disk):
        fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            with pytest.raises(OSError) as failed:
                fileio.pwrite_all(fd, b"x", 0)
                fileio.fdatasync(fd)
            assert failed.value.errno == code
            disk.mend(tmp_path)
            fileio.pwrite_all(fd, b"x", 0)
            fileio.fdatasync(fd)
        finally:
            os.close(fd)
