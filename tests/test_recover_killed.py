"""`pora recover` SIGKILLed part way (during its replay, its flushes, its deletes of
the journal), again and again: the next start still has every acknowledged add."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import trio
from crash_support import ROOT, kill_writer
from test_crash import check_acknowledged


def recover_killed_after(data_dir: Path, after_s: float) -> tuple[int | None, str]:
    """Run `pora recover`, SIGKILL it after `after_s` unless it ended; its status
    (None: killed) and what it wrote to stderr."""
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "pora.cli", "recover", "--data-dir", str(data_dir)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        time.sleep(after_s)  # a kill somewhere in a real process's work: no event to wait on
        process.send_signal(signal.SIGKILL)
        status = process.wait()
        stderr.seek(0)
        said = stderr.read().decode(errors="replace")
    return (None if status == -signal.SIGKILL else status), said


@pytest.mark.slow
def test_recover_killed_over_and_over_loses_nothing(data_dir: Path) -> None:
    acked: set[tuple[int, int]] = set()
    for kill_after_s in (3.0, 2.0):
        acked |= kill_writer(data_dir, kill_after_s, after_ready=False, writers=16)
        for recover_s in (0.4, 0.7, 1.0, 1.4):
            status, said = recover_killed_after(data_dir, recover_s)
            assert status in (None, 0), f"pora recover exited {status}: {said}"
    assert acked
    trio.run(check_acknowledged, data_dir, acked)
