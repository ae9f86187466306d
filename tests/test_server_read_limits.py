"""Read responses a peer does not read are bounded, per connection and node-wide.

Peers on raw sockets pipeline many large reads and never read a reply: the bytes of
read responses the node holds stay under its limits, its memory does not grow with
the requests, it keeps answering others, and gives everything back once they close.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from net_helpers import raw_connection, serving
from waiting import wait_until

from netio import codec
from netio.messages import ReadEntry, ReadRange
from pora.client.node_client import connect_node
from pora.server.server import Server

MIB = 1024 * 1024


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _flood(address: str, frames: bytes, streams: list[trio.SocketStream]) -> None:
    """Send the frames and never read a reply (the send stalls once the node stops
    reading this socket: that is the point)."""
    stream = await raw_connection(address)
    streams.append(stream)
    await stream.send_all(frames)


async def _until_all_given_back(server: Server) -> None:
    """Wait (polling: the connections end in their own time) until every connection
    has closed and given back its bytes."""

    def given_back() -> bool:
        stats = server.statistics()
        return not stats.connections_open and not stats.read_bytes_held

    await wait_until(given_back, 10.0)


async def _most_held_while(server_stats: object, seconds: float) -> int:
    most = 0
    deadline = trio.current_time() + seconds
    while trio.current_time() < deadline:
        stats = server_stats()  # type: ignore[operator]
        most = max(most, getattr(stats, "read_bytes_held", 0))
        await trio.sleep(0.01)
    return most


async def test_unread_read_entry_responses_stay_within_the_connection_limit(
    data_dir: Path,
) -> None:
    limit = 4 * MIB
    async with serving(
        data_dir,
        node_options={"entry_bytes_max": MIB + 1024},
        read_bytes_per_connection_max=limit,
    ) as (node, server, address):
        await node.add_entry(1, 0, os.urandom(MIB))
        before = _resident_bytes()
        frames = b"".join(codec.encode_request(ReadEntry(i, 1, 0)) for i in range(1, 301))
        streams: list[trio.SocketStream] = []
        async with trio.open_nursery() as attackers:
            attackers.start_soon(_flood, address, frames, streams)
            most = await _most_held_while(server.statistics, 1.5)
            grown = _resident_bytes() - before
            assert most <= limit
            assert grown < 64 * MIB, f"the node grew by {grown // MIB} MiB"
            async with connect_node(address) as other:  # others are served meanwhile
                assert (await other.info()).ledger_count == 1
                assert len(await other.read_entry(1, 0)) == MIB
            for stream in streams:
                await stream.aclose()
            attackers.cancel_scope.cancel()
        await _until_all_given_back(server)


@pytest.mark.slow
async def test_unread_range_responses_stay_within_the_node_limit(data_dir: Path) -> None:
    node_limit = 8 * MIB
    async with serving(
        data_dir,
        node_options={"entry_bytes_max": 256 * 1024},
        read_bytes_per_connection_max=2 * MIB,
        read_bytes_node_max=node_limit,
    ) as (node, server, address):
        await node.add_entries([(2, i, os.urandom(256 * 1024)) for i in range(8)])
        before = _resident_bytes()
        frames = b"".join(
            codec.encode_request(ReadRange(i, 2, 0, 7, 100, MIB)) for i in range(1, 61)
        )
        streams: list[trio.SocketStream] = []
        async with trio.open_nursery() as attackers:
            for _ in range(10):
                attackers.start_soon(_flood, address, frames, streams)
            most = await _most_held_while(server.statistics, 2.0)
            grown = _resident_bytes() - before
            assert most <= node_limit
            assert grown < 96 * MIB, f"the node grew by {grown // MIB} MiB"
            async with connect_node(address) as other:
                assert (await other.info()).ledger_count == 1
                await other.add_entry(3, 0, b"still taking writes")
            for stream in streams:
                await stream.aclose()
            attackers.cancel_scope.cancel()
        await _until_all_given_back(server)
        assert server.statistics().reads_waiting == 0
        async with connect_node(address) as reader:  # reads go on once they left
            assert len(await reader.read_range(2, 0, 7, max_bytes=MIB)) == 4


async def test_a_response_larger_than_the_connection_limit_is_served(data_dir: Path) -> None:
    async with (
        serving(data_dir, read_bytes_per_connection_max=64 * 1024) as (node, server, address),
        connect_node(address) as client,
    ):
        await node.add_entry(4, 0, b"z" * MIB)
        async with trio.open_nursery() as readers:
            for _ in range(5):
                readers.start_soon(client.read_entry, 4, 0)
        assert await client.read_entry(4, 0) == b"z" * MIB
        assert [s.ledger_id for s in await client.list_ledgers()] == [4]
        assert server.statistics().read_bytes_held == 0
