"""A `pora cluster` of real `pora serve` processes for a test that talks to it over
TCP from any event loop: started as a subprocess, ready once its nodes are registered,
stopped by SIGTERM (SIGKILL past patience) with its leftover nodes killed.

    with pora_cluster_process(tmp_path / "cluster", nodes=3) as url:
        asyncio.run(main(url))   # pora.connect(url) reaches the three nodes
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio
from test_cli_cluster import free_base_port, kill_leftover_nodes

import pora
from pora.meta.backends import open_metadata

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


async def _writable_nodes(url: str) -> int:
    try:
        async with open_metadata(url) as store:
            return len(await store.list_nodes(writable_only=True))
    except pora.MetadataError:  # the cluster is still creating the store
        return 0


@contextmanager
def pora_cluster_process(
    folder: Path, nodes: int = 3, metadata: str | None = None
) -> Iterator[str]:
    """`pora cluster --nodes N --dir folder` registered in `metadata` (by default a
    SQLite file in `folder`); yields the metadata URL once all N nodes registered."""
    url = metadata or f"sqlite://{folder / 'meta.db'}"
    command = [
        sys.executable, "-m", "pora.cli", "cluster", "--nodes", str(nodes),
        "--dir", str(folder), "--base-port", str(free_base_port(nodes)), "--metadata", url,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while trio.run(_writable_nodes, url) < nodes:
            assert process.poll() is None, f"pora cluster exited ({command})"
            assert time.monotonic() < deadline, (
                f"the {nodes} nodes of pora cluster in {folder} did not register in {url} "
                f"within {START_TIMEOUT_S} s"
            )
            time.sleep(0.05)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        kill_leftover_nodes(folder)
