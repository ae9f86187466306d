"""The README's quick start: examples/replicated_ledger.py, run as the README says (no
arguments, next to ./pora-cluster), writes a replicated ledger to a real 3-node
`pora cluster` and reads it back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from test_cli_cluster import cluster

EXAMPLE = Path(__file__).parent.parent / "examples" / "replicated_ledger.py"


@pytest.mark.slow
async def test_the_quick_start_example_writes_and_reads_back_a_replicated_ledger(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 3) as running:
        await running.wait_for_line("ready: 3 nodes")
        # the example's default URL, sqlite:pora-cluster/meta.db, from the folder above
        (tmp_path / "pora-cluster").symlink_to(running.folder)
        with trio.fail_after(60):
            result = await trio.run_process(
                [sys.executable, str(EXAMPLE)],
                cwd=tmp_path,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert result.returncode == 0, result.stderr.decode()
    lines = result.stdout.decode().splitlines()
    assert lines[0].startswith("ledger ") and lines[0].count("127.0.0.1:") == 3
    assert lines[1:] == [
        "appended entry 0",
        "appended entry 1",
        "appended entry 2",
        "read entry 0: hello",
        "read entry 1: replicated",
        "read entry 2: world",
    ]
