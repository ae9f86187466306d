"""Real small filesystems for fault tests: an ext4 image made by the test, loop
mounted where the test says (the whole data dir, or one of its folders), and a
filler that leaves it with exactly as little free space as the test wants.

Mounting needs root and a loop device; where either is missing the test is
skipped with the reason, never run against the host's own disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path


class SmallFilesystems:
    """Mounts ext4 images under a test's temp dir and unmounts them all at the end."""

    def __init__(self, images_dir: Path) -> None:
        self._images_dir = images_dir
        self._mounted: list[Path] = []

    def mount(self, mount_point: Path, size_mib: int, *, move_contents: bool = False) -> Path:
        """A fresh ext4 filesystem of `size_mib` mounted at `mount_point` (made if
        missing; empty, or with `move_contents` its files are moved onto the new
        filesystem). No blocks are reserved for root: the node runs as root in
        tests, and a full disk must be full for it too."""
        import pytest  # noqa: PLC0415 (only the tests that mount need pytest's skip)

        mount_point.mkdir(parents=True, exist_ok=True)
        held = mount_point.with_name(mount_point.name + ".before-mount")
        if any(mount_point.iterdir()):
            if not move_contents:
                raise ValueError(
                    f"{mount_point} is not empty: mount on an empty folder, or move_contents"
                )
            mount_point.rename(held)
            mount_point.mkdir()
        self._images_dir.mkdir(parents=True, exist_ok=True)
        image = self._images_dir / f"fs{len(self._mounted)}.ext4"
        with open(image, "wb") as file:
            file.truncate(size_mib << 20)
        made = subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext4 image here: {made.stderr.strip()}")
        mounted = subprocess.run(
            ["mount", "-o", "loop", str(image), str(mount_point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot loop-mount an ext4 image here (needs root): {mounted.stderr}")
        self._mounted.append(mount_point)
        # a fresh ext4 has lost+found: a data dir's folders must look as the node made them
        shutil.rmtree(mount_point / "lost+found", ignore_errors=True)
        if held.exists():
            for item in held.iterdir():
                shutil.move(item, mount_point / item.name)
            held.rmdir()
        return mount_point

    def unmount_all(self) -> None:
        for mount_point in reversed(self._mounted):
            subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True)
        self._mounted.clear()


def fill(folder: Path, leave_bytes: int = 0, *, name: str = "filler") -> Path:
    """Write a file into `folder` until its filesystem has at most `leave_bytes`
    free (ENOSPC stops it early, which is fine); returns the file, to delete when
    the test wants the space back."""
    filler = folder / name
    chunk = b"\xa5" * (1 << 20)
    with open(filler, "ab") as file:
        while True:
            free = shutil.disk_usage(folder).free
            if free <= leave_bytes:
                break
            try:
                file.write(chunk[: min(len(chunk), free - leave_bytes)])
                file.flush()
            except OSError:
                break
        with contextlib.suppress(OSError):  # a full disk may refuse the metadata too
            os.fsync(file.fileno())
    return filler
