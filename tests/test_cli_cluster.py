"""`pora cluster` as a real process: N `pora serve` nodes registered in one store,
stopped together by SIGTERM, and a node killed under it reported while the others
keep serving."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from waiting import wait_until_true
from zookeeper_support import fresh_zk_url

import pora
from pora.cli import main
from pora.meta.backends import open_metadata
from pora.node.datadir import read_cluster_id

START_TIMEOUT_S = 60.0


def free_base_port(count: int) -> int:
    """A base port with `count` free ports above it (checked by binding them)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base: int = probe.getsockname()[1] - 1
        if base + count > 65535:
            continue
        sockets = []
        try:
            for k in range(1, count + 1):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", base + k))
        except OSError:
            continue
        else:
            return base
        finally:
            for s in sockets:
                s.close()
    raise AssertionError("no run of free ports found")


@dataclass
class RunningCluster:
    process: trio.Process
    lines: list[str]
    got_line: trio.Event
    folder: Path

    async def wait_for_line(self, text: str) -> str:
        with trio.fail_after(START_TIMEOUT_S):
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                assert self.process.poll() is None, "\n".join(self.lines)
                await self.got_line.wait()
                self.got_line = trio.Event()


@asynccontextmanager
async def cluster(
    tmp_path: Path, nodes: int, metadata: str | None = None
) -> AsyncIterator[RunningCluster]:
    folder = tmp_path / "cluster"
    command = [
        sys.executable, "-m", "pora.cli", "cluster", "--nodes", str(nodes),
        "--dir", str(folder), "--base-port", str(free_base_port(nodes)),
        "--node-arg=--registration-lease-s=1",
        *([] if metadata is None else ["--metadata", metadata]),
    ]  # fmt: skip
    process = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=os.environ
    )
    running = RunningCluster(process, [], trio.Event(), folder)

    async def read_output() -> None:
        assert process.stdout is not None
        pending = b""
        async for chunk in process.stdout:
            pending += chunk
            *whole, pending = pending.split(b"\n")
            running.lines.extend(line.decode() for line in whole)
            running.got_line.set()
        running.got_line.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_output)
            yield running
            nursery.cancel_scope.cancel()
    finally:
        if process.poll() is None:
            process.kill()
        await process.wait()
        kill_leftover_nodes(folder)


def serve_processes(folder: Path) -> dict[int, list[bytes]]:
    """Pid -> command line of the `pora serve` processes on this cluster's data dirs."""
    found: dict[int, list[bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and b"--data-dir" in args:
            data_dir = Path(args[args.index(b"--data-dir") + 1].decode())
            if data_dir.parent == folder:
                found[int(entry.name)] = args
    return found


def kill_leftover_nodes(folder: Path) -> None:
    """SIGKILL the cluster's nodes still running: they run in sessions of their own, so
    a `pora cluster` killed (or stopped past a test's patience) leaves them behind."""
    for pid in serve_processes(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def node_pids(folder: Path) -> dict[int, int]:
    """Node number -> pid of the `pora serve` processes on this cluster's data dirs."""
    return {
        int(Path(args[args.index(b"--data-dir") + 1].decode()).name.removeprefix("node-")): pid
        for pid, args in serve_processes(folder).items()
    }


async def registered(url: str) -> set[str]:
    async with open_metadata(url) as store:
        return {n.address for n in await store.list_nodes()}


async def one_cluster(url: str, folder: Path, nodes: int) -> str:
    """The store's cluster id, which every node's data dir joined (nodes set up a
    new store together: one id, whichever node made it)."""
    async with open_metadata(url) as store:
        cluster_id = await store.cluster_id()
    assert cluster_id is not None
    joined = {read_cluster_id(folder / f"node-{k}") for k in range(1, nodes + 1)}
    assert joined == {cluster_id}
    return cluster_id


@pytest.mark.slow
async def test_a_cluster_registers_every_node_and_sigterm_stops_them_all(tmp_path: Path) -> None:
    async with cluster(tmp_path, 3) as running:
        url = (await running.wait_for_line("metadata URL: ")).split(": ", 1)[1]
        assert url == f"sqlite://{running.folder / 'meta.db'}"
        await running.wait_for_line("ready: 3 nodes")
        addresses = await registered(url)
        assert len(addresses) == 3
        health = [line for line in running.lines if ": registered, " in line]
        assert len(health) == 3 and all("writable" in line for line in health)
        pids = node_pids(running.folder)
        assert sorted(pids) == [1, 2, 3]
        async with pora.connect_node(sorted(addresses)[0]) as client:
            await client.add_entry(1, 0, b"in a cluster")

        running.process.send_signal(signal.SIGTERM)
        with trio.fail_after(START_TIMEOUT_S):
            assert await running.process.wait() == 0, "\n".join(running.lines)
        assert node_pids(running.folder) == {}  # no stragglers
        assert await registered(url) == set()
        cluster_id = await one_cluster(url, running.folder, 3)
    for k in (1, 2, 3):
        assert "stopped cleanly" in (running.folder / f"node-{k}.log").read_text()
    # the quick start again on the same folder: the same cluster, nodes accepted
    async with cluster(tmp_path, 3) as again:
        await again.wait_for_line("ready: 3 nodes")
        assert await one_cluster(url, again.folder, 3) == cluster_id


@pytest.mark.slow
async def test_a_cluster_on_zookeeper_registers_there_and_stops_cleanly(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = fresh_zk_url(request)
    async with cluster(tmp_path, 2, metadata=url) as running:
        assert (await running.wait_for_line("metadata URL: ")).split(": ", 1)[1] == url
        await running.wait_for_line("ready: 2 nodes")
        assert len(await registered(url)) == 2
        assert not (running.folder / "meta.db").exists()
        await one_cluster(url, running.folder, 2)
        running.process.send_signal(signal.SIGTERM)
        with trio.fail_after(START_TIMEOUT_S):
            assert await running.process.wait() == 0, "\n".join(running.lines)
        assert node_pids(running.folder) == {}
        assert await registered(url) == set()


@pytest.mark.slow
async def test_a_node_killed_under_the_cluster_is_reported_and_the_others_keep_running(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, 2) as running:
        url = (await running.wait_for_line("metadata URL: ")).split(": ", 1)[1]
        await running.wait_for_line("ready: 2 nodes")
        pids = node_pids(running.folder)
        os.kill(pids[1], signal.SIGKILL)
        line = await running.wait_for_line("exited with status")
        assert line.startswith("node-1 ")
        assert "killed by SIGKILL" in line
        assert str(running.folder / "node-1.log") in line

        # the killed node's lease runs out (1 s); the survivor stays registered
        async def one_left() -> bool:
            return len(await registered(url)) == 1

        await wait_until_true(one_left, 15)
        (survivor,) = await registered(url)
        async with pora.connect_node(survivor) as client:
            await client.add_entry(1, 0, b"still here")
        assert running.process.poll() is None

        running.process.send_signal(signal.SIGTERM)
        with trio.fail_after(START_TIMEOUT_S):
            assert await running.process.wait() == 1  # one node did not stop cleanly
        assert node_pids(running.folder) == {}


@pytest.mark.slow
async def test_a_node_that_cannot_start_is_named_with_its_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [
            sys.executable, "-m", "pora.cli", "cluster", "--nodes", "1",
            "--dir", str(tmp_path / "c"), "--base-port", str(port - 1),
        ]  # fmt: skip
        result = await trio.run_process(
            command, capture_stdout=True, capture_stderr=True, check=False
        )
    assert result.returncode == 1
    err = result.stderr.decode()
    assert f"node-1 (127.0.0.1:{port}) exited with status 2 before it registered" in err
    assert str(tmp_path / "c" / "node-1.log") in err
    assert "is in use by another process" in err


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["cluster", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--nodes", "--dir", "--base-port", "--metadata", "--stop-timeout-s"):
        assert flag in text
    assert "SIGKILL" in text
