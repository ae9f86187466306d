"""The real crash writer (`scripts/crash_writer.py`) as a child process: start it,
SIGKILL it, and collect what it acknowledged before it died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from crash_writer import payload_for  # noqa: E402

WRITER = ROOT / "scripts" / "crash_writer.py"
#: how long a writer may take to open its node (recovery included) on a busy machine
READY_DEADLINE_S = 60.0

__all__ = ["ROOT", "kill_writer", "payload_for", "start_writer"]


def start_writer(
    data_dir: Path, *, writers: int = 8, ledgers_per_writer: int = 2
) -> subprocess.Popen[bytes]:
    """The writer, running on `data_dir`; it prints `ready` once its node is open."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, str(WRITER), str(data_dir), "--writers", str(writers)]
    command += ["--ledgers-per-writer", str(ledgers_per_writer)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, env=env)


def kill_writer(
    data_dir: Path,
    seconds: float,
    *,
    after_ready: bool,
    writers: int = 8,
    ledgers_per_writer: int = 2,
) -> frozenset[tuple[int, int]]:
    """Run the writer on `data_dir`, SIGKILL it `seconds` after it starts (or, with
    `after_ready`, after its node is open: kills before then land in recovery), and
    return the (ledger_id, entry_id) of every add it acknowledged."""
    child = start_writer(data_dir, writers=writers, ledgers_per_writer=ledgers_per_writer)
    assert child.stdout is not None
    stdout_fd = child.stdout.fileno()
    chunks: list[bytes] = []
    ready = threading.Event()

    def drain() -> None:  # so the child never blocks on a full pipe
        while chunk := os.read(stdout_fd, 65536):
            chunks.append(chunk)
            if not ready.is_set() and b"ready\n" in b"".join(chunks):
                ready.set()

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        if after_ready:
            assert ready.wait(READY_DEADLINE_S), f"the writer was not ready in {READY_DEADLINE_S} s"
        # the one real-time wait: how far the writer gets is what the test varies
        time.sleep(seconds)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        reader.join()
        child.stdout.close()
    acked: set[tuple[int, int]] = set()
    for line in b"".join(chunks).split(b"\n")[:-1]:  # the last piece may be cut short
        if line.startswith(b"ack "):
            _, ledger_id, entry_id = line.split()
            acked.add((int(ledger_id), int(entry_id)))
    return frozenset(acked)
