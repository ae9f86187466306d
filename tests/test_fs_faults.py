"""The fault tests' small filesystems are real and really fill up."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from fs_faults import SmallFilesystems, fill


def test_a_small_filesystem_fills_to_what_is_asked_and_frees(
    tmp_path: Path, small_filesystems: SmallFilesystems
) -> None:
    folder = small_filesystems.mount(tmp_path / "data" / "ledgers", size_mib=8)
    assert not any(folder.iterdir())
    assert shutil.disk_usage(folder).total < 8 << 20
    filler = fill(folder, leave_bytes=64 << 10)
    assert shutil.disk_usage(folder).free <= 64 << 10
    with pytest.raises(OSError) as raised, open(folder / "more", "wb") as file:
        file.write(b"x" * (1 << 20))
        file.flush()
    assert raised.value.errno == errno.ENOSPC
    filler.unlink()
    assert shutil.disk_usage(folder).free > 4 << 20
