"""Takeover against real processes (issue 27): three `pora serve` nodes, a stream
writer process appending from 32 tasks across rollovers (tests/stream_writer_process.py)
and a subscriber in this process, with SQLite and with ZooKeeper metadata. The writer
is SIGKILLed (or SIGSTOPped) mid-segment; a second writer takes over and appends; the
subscriber, which ran throughout, has every acknowledged entry once, in position
order. A SIGSTOPped writer resumed after the takeover gets WriterFenced, and anything
it logged as acknowledged is in the stream."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from functools import partial
from pathlib import Path

import pytest
import trio
from cluster_process import pora_cluster_process
from waiting import wait_until
from zookeeper_support import fresh_zk_url

import pora
from pora import Position

WRITER_SCRIPT = Path(__file__).with_name("stream_writer_process.py")
WRITER_TASKS = 32
WAIT_S = 90.0


def logged(log_path: Path) -> tuple[dict[Position, str], list[str], list[str]]:
    """(acknowledged position -> digest, fenced lines, other lines) of complete lines."""
    text = log_path.read_text(encoding="ascii") if log_path.exists() else ""
    acks: dict[Position, str] = {}
    fenced: list[str] = []
    other: list[str] = []
    for line in text.split("\n")[:-1]:
        words = line.split(" ")
        if words[0] == "ack":
            acks[Position.parse(words[1])] = words[2]
        elif words[0] == "fenced":
            fenced.append(line)
        elif words[0] not in ("open", "done"):
            other.append(line)
    return acks, fenced, other


def _grew_or_ended(log_path: Path, lines: int, process: trio.Process) -> bool:
    """The writer process logged a line past `lines` (an ack or its fencing), or ended."""
    return process.returncode is not None or _lines(log_path) > lines


async def _nodes_writable(client: pora.Client, count: int) -> None:
    """Polls (no event tells of a renewed lease) until `count` nodes are writable."""
    with trio.fail_after(WAIT_S):
        while True:
            if len(await client.store.list_nodes(writable_only=True)) >= count:
                return
            await trio.sleep(0.1)


def _lines(log_path: Path) -> int:
    return log_path.read_bytes().count(b"\n")


async def takeover_of_a_process(url: str, log_path: Path, stop_signal: signal.Signals) -> None:
    async with pora.connect(url) as client:
        stream = await client.create_stream("orders", segment_bytes_max=64 << 10)
        seen: list[tuple[Position, bytes]] = []
        second_acks: dict[Position, bytes] = {}

        async def subscribe() -> None:
            async for item in stream.subscribe():
                seen.append(item)

        command = [sys.executable, str(WRITER_SCRIPT), url, "orders", str(log_path)]
        writer = await trio.lowlevel.open_process([*command, str(WRITER_TASKS)], env=os.environ)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscribe)
                # a few segments in, then stopped mid-segment
                await wait_until(lambda: len(logged(log_path)[0]) >= 400, WAIT_S)
                writer.send_signal(stop_signal)
                while True:
                    try:
                        async with stream.open_writer() as second:
                            for k in range(100):
                                payload = b"second %d" % k
                                second_acks[await second.append(payload)] = payload
                        break
                    except (pora.MetadataUnavailable, pora.NotEnoughNodes):
                        # stopped while it held SQLite's write lock (docs/metadata.md,
                        # "A stalled SQLite writer": every write times out, the nodes'
                        # leases lapse): let it run past its transaction, wait for the
                        # nodes to renew, stop it again and take over again
                        assert stop_signal is signal.SIGSTOP
                        lines = _lines(log_path)
                        writer.send_signal(signal.SIGCONT)
                        await wait_until(partial(_grew_or_ended, log_path, lines, writer), WAIT_S)
                        await _nodes_writable(client, 3)
                        if writer.returncode is None:
                            writer.send_signal(signal.SIGSTOP)
                if stop_signal is signal.SIGSTOP:
                    writer.send_signal(signal.SIGCONT)
                    with trio.fail_after(WAIT_S):
                        assert await writer.wait() == 0
                first_acks, fenced, other = logged(log_path)
                everything = set(first_acks) | set(second_acks)
                await wait_until(lambda: everything <= {p for p, _ in seen}, WAIT_S)
                nursery.cancel_scope.cancel()
        finally:
            if writer.returncode is None:
                writer.kill()
            await writer.wait()

        assert other == []
        if stop_signal is signal.SIGSTOP:  # every task learnt it was fenced
            assert len(fenced) == WRITER_TASKS
        positions = [position for position, _ in seen]
        assert positions == sorted(set(positions))  # each once, in order
        payloads = dict(seen)
        for position, digest in first_acks.items():
            assert hashlib.sha256(payloads[position]).hexdigest() == digest
        for position, payload in second_acks.items():
            assert payloads[position] == payload
        assert min(second_acks) > max(first_acks)
        # the stream read afterwards holds exactly what the subscriber saw
        assert [item async for item in stream.read(to=max(second_acks))] == [
            item for item in seen if item[0] < max(second_acks)
        ]
        assert len((await stream.info()).segments) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("metadata", ["sqlite", "zk"])
@pytest.mark.parametrize("stop_signal", [signal.SIGKILL, signal.SIGSTOP], ids=["kill", "stop"])
def test_a_second_writer_takes_over_from_a_stopped_process(
    tmp_path: Path, stop_signal: signal.Signals, metadata: str, request: pytest.FixtureRequest
) -> None:
    url = fresh_zk_url(request) if metadata == "zk" else None
    with pora_cluster_process(tmp_path / "cluster", nodes=3, metadata=url) as url:
        trio.run(takeover_of_a_process, url, tmp_path / "writer.log", stop_signal)
