"""Append + fdatasync into fallocated space against zero-filled space.

Why the journal keeps zero-filled spare segments (journal/spares.py): a write into
`posix_fallocate`d (unwritten) extents makes the next fdatasync commit their
conversion as well. This loop measures it on the disk you point it at, optionally
with a spare being zero-filled beside it. Prints a table; not a test.

    python scripts/bench_zerofill.py --dir /var/lib/pora
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

MIB = 1 << 20


def prepare(path: Path, size: int, how: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    if how == "fallocated":
        os.posix_fallocate(fd, 0, size)
    else:
        zeros = bytes(8 * MIB)
        for offset in range(0, size, len(zeros)):
            os.pwrite(fd, zeros[: min(len(zeros), size - offset)], offset)
    os.fsync(fd)
    return fd


def zero_fill_beside(path: Path, size: int, stop: threading.Event) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    zeros = bytes(MIB)
    try:
        for offset in range(0, size, MIB):
            if stop.is_set():
                return
            os.pwrite(fd, zeros, offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def measure(directory: Path, how: str, beside: bool, args: argparse.Namespace) -> str:
    size = args.file_mib * MIB
    fd = prepare(directory / "journal", size, how)
    stop = threading.Event()
    helper = None
    if beside:
        helper = threading.Thread(
            target=zero_fill_beside, args=(directory / "spare", size, stop), daemon=True
        )
        helper.start()
    data = os.urandom(args.write_kib * 1024)
    latencies: list[float] = []
    offset = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < args.seconds and offset + len(data) <= size:
            before = time.perf_counter()
            os.pwrite(fd, data, offset)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - before)
            offset += len(data)
    finally:
        elapsed = time.perf_counter() - started
        stop.set()
        if helper is not None:
            helper.join()
        os.close(fd)
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e6
    p99 = latencies[int(len(latencies) * 0.99)] * 1e6
    rate = len(latencies) / elapsed
    label = f"{how}{' + a spare being zero-filled' if beside else ''}"
    return f"{label:<44} {rate:>9,.0f} {rate * len(data) / 1e6:>8,.0f} {p50:>8,.0f} {p99:>8,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (a temp dir)")
    parser.add_argument("--write-kib", type=int, default=256, help="bytes per append (256 KiB)")
    parser.add_argument("--file-mib", type=int, default=256, help="file size (256 MiB)")
    parser.add_argument("--seconds", type=float, default=2.0, help="per case (2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pora-zerofill-", dir=args.dir) as temp:
        directory = Path(temp)
        print(f"{'space written into':<44} {'syncs/s':>9} {'MB/s':>8} {'p50 us':>8} {'p99 us':>8}")
        for how in ("fallocated", "zero-filled"):
            for beside in (False, True):
                print(measure(directory, how, beside, args), flush=True)


if __name__ == "__main__":
    main()
