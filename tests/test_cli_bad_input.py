"""The real `pora` command, in a subprocess, given a malformed metadata URL, an
unreachable node, or an empty value for a setting: one clear line on stderr and exit
status 2 (a refusal), never a traceback, an ExceptionGroup, or a node started as if
the value had been left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: a generous bound for one command on a loaded machine (each refuses within a second)
COMMAND_TIMEOUT_S = 120


def pora(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pora.cli", *arguments],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["nodes", "--metadata", "zk://127.0.0.1:notaport/x"], "the port 'notaport'"),
        (["nodes", "--metadata", "zk://[::1/x"], "needs its closing bracket"),
        (["ledger", "list", "--metadata", "zk://127.0.0.1:notaport/x"], "is not a number"),
        (["cluster", "--nodes", "1", "--metadata", "zk://[::1/x"], "closing bracket"),
        (["cluster", "--nodes", "1", "--metadata", ""], "--metadata is empty"),
        (["bench", "--connect", "127.0.0.1:1", "--no-redis"], "cannot connect to node"),
        (["bench", "--connect", "", "--no-redis"], "an empty address"),
        (["bench", "--connect", "127.0.0.1:x", "--no-redis"], "is not host:port"),
        (["serve", "--rack", ""], "expected a non-empty label"),
        (["serve", "--metadata", ""], "got an empty value"),
        (["serve", "--metadata", "zk://127.0.0.1:notaport/x"], "the port 'notaport'"),
        (["serve", "--advertise", ""], "got an empty value"),
        (["serve", "--data-dir", ""], "expected a directory"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_bad_input_is_refused_in_one_line_with_exit_status_2(
    tmp_path: Path, arguments: list[str], says: str
) -> None:
    done = pora(tmp_path, *arguments)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "ExceptionGroup" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pora"), lines[0]
    assert says in lines[0]
    # nothing was started or created in the folder it ran in
    assert list(tmp_path.iterdir()) == []
