from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fs_faults import SmallFilesystems


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "pora-data"


@pytest.fixture(autouse=True)
def _quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)


@pytest.fixture
def tiny_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs), to fill up for disk-full tests. Needs root."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.fixture
def small_filesystems(tmp_path: Path) -> Iterator[SmallFilesystems]:
    """Real ext4 filesystems of a few MiB, loop-mounted wherever the test asks
    (`small_filesystems.mount(folder, size_mib)`); skipped without root."""
    filesystems = SmallFilesystems(tmp_path / "images")
    try:
        yield filesystems
    finally:
        filesystems.unmount_all()


# the Spark tests' session-wide SparkSession and cluster (tests/spark_support.py)
from spark_support import spark_cluster, spark_session  # noqa: E402, F401
