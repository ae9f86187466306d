"""The README's stream example: examples/stream.py, run as the README says (no
arguments, next to ./pora-cluster), writes a stream on a real 3-node `pora cluster`
while a subscriber follows it; run again, a new writer takes the stream over in a new
segment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
from test_cli_cluster import cluster

EXAMPLE = Path(__file__).parent.parent / "examples" / "stream.py"


async def run_example(folder: Path) -> list[str]:
    with trio.fail_after(60):
        result = await trio.run_process(
            [sys.executable, str(EXAMPLE)],
            cwd=folder,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode()
    return sorted(result.stdout.decode().splitlines())  # the two tasks interleave


@pytest.mark.slow
async def test_the_stream_example_writes_and_follows_a_stream(tmp_path: Path) -> None:
    async with cluster(tmp_path, 3) as running:
        await running.wait_for_line("ready: 3 nodes")
        (tmp_path / "pora-cluster").symlink_to(running.folder)
        for segment in (0, 1):
            assert await run_example(tmp_path) == [
                f"appended at {segment}:0",
                f"appended at {segment}:1",
                f"appended at {segment}:2",
                f"subscriber got {segment}:0: hello",
                f"subscriber got {segment}:1: streamed",
                f"subscriber got {segment}:2: world",
            ]
