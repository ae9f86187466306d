"""`NodeChannel`: the TCP and in-process channels give the same outcomes for one
scripted sequence; a node whose data dir was replaced is refused by instance id."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from net_helpers import serving

import pora
from pora.client.local_channel import LocalChannel
from pora.client.node_channel import NodeChannel, RangeAnswer
from pora.client.node_client import connect_node
from pora.client.tcp_channel import TcpChannel
from pora.server.server import Server, ServerConfig

KEY = b"k" * 32
OTHER_KEY = b"o" * 32


@contextlib.asynccontextmanager
async def channel_to(kind: str, data_dir: Path) -> AsyncIterator[tuple[NodeChannel, str]]:
    """A channel of `kind` to a node on `data_dir`, and the node's instance id."""
    if kind == "local":
        async with pora.open_node(data_dir) as node:
            yield LocalChannel(node), node.data_dir.instance_id
    else:
        async with (
            serving(data_dir) as (node, _server, address),
            connect_node(address, timeout_s=10) as client,
        ):
            yield TcpChannel(client), node.data_dir.instance_id


def _name(outcome: object) -> str:
    return "ok" if outcome is None else type(outcome).__name__


async def _script(channel: NodeChannel, instance: str) -> list[object]:
    """One sequence of every operation; what each gave, in a comparable form."""
    seen: list[object] = []
    identity = await channel.identity()
    seen.append(identity.instance_id == instance and identity.read_only_reason is None)
    outcomes = await channel.add_entries(
        7, [(0, b"a"), (3, b"b"), (6, b"c")], master_key=KEY, last_add_confirmed=-1
    )
    seen.append([_name(o) for o in outcomes])
    outcomes = await channel.add_entries(
        7,
        [(4, b"d"), (3, b"other"), (5, b"e")],
        master_key=KEY,
        last_add_confirmed=0,
        instance_id=instance,
    )
    seen.append([_name(o) for o in outcomes])  # the conflict is entry 3's alone
    seen.append(await channel.read_entry(7, 3))
    seen.append(await channel.read_range(7, 0, 10, max_entries=2))
    seen.append(await channel.read_range(7, 0, 10))
    seen.append(await channel.read_lac(7))
    seen.append(await channel.write_lac(7, 5, master_key=KEY))
    seen.append(await channel.read_lac(7, known_lac=5, wait_s=0.05))
    for call in (
        channel.read_entry(7, 1),
        channel.read_entry(99, 0),
        channel.write_lac(7, 9, master_key=OTHER_KEY),
        channel.read_lac(7, fence_key=OTHER_KEY),
        channel.read_entry(7, 0, instance_id="another instance"),
    ):
        try:
            seen.append(await call)
        except pora.PoraError as error:
            seen.append(type(error).__name__)
    # a recovery fences a node that never saw the ledger: it is created fenced
    seen.append(await channel.read_lac(70, fence_key=KEY))
    outcomes = await channel.add_entries(70, [(0, b"x")], master_key=KEY, last_add_confirmed=-1)
    seen.append([_name(o) for o in outcomes])
    outcomes = await channel.add_entries(
        70, [(0, b"x")], master_key=KEY, last_add_confirmed=-1, recovery=True
    )
    seen.append([_name(o) for o in outcomes])
    seen.append(await channel.read_entry(70, 0, fence_key=KEY))
    seen.append(await channel.close_ledger(7, 4, master_key=KEY))
    outcomes = await channel.add_entries(7, [(8, b"late")], master_key=KEY, last_add_confirmed=4)
    seen.append([_name(o) for o in outcomes])
    try:
        await channel.delete_ledger(7, master_key=OTHER_KEY)
    except pora.Unauthorized:
        seen.append("Unauthorized")
    await channel.delete_ledger(7, master_key=KEY)
    try:
        await channel.read_lac(7)
    except pora.NoSuchLedger:
        seen.append("NoSuchLedger")
    return seen


async def test_tcp_and_local_channels_give_the_same_outcomes(tmp_path: Path) -> None:
    async with channel_to("local", tmp_path / "local") as (channel, instance):
        local = await _script(channel, instance)
    async with channel_to("tcp", tmp_path / "tcp") as (channel, instance):
        tcp = await _script(channel, instance)
    assert local == tcp
    assert local == [
        True,
        ["ok", "ok", "ok"],
        ["ok", "EntryConflict", "ok"],
        (b"b", 0),
        RangeAnswer([(0, b"a"), (3, b"b")], 0, 3),
        RangeAnswer([(0, b"a"), (3, b"b"), (4, b"d"), (5, b"e"), (6, b"c")], 0, 10),
        (0, 6),
        5,
        (5, 6),
        "NoSuchEntry",
        "NoSuchLedger",
        "Unauthorized",
        "Unauthorized",
        "InstanceMismatch",
        (-1, -1),
        ["LedgerFenced"],
        ["ok"],
        (b"x", -1),
        4,
        ["LedgerClosed"],
        "Unauthorized",
        "NoSuchLedger",
    ]


@pytest.mark.parametrize("kind", ["local", "tcp"])
async def test_an_oversized_entry_fails_alone(kind: str, data_dir: Path) -> None:
    async with channel_to(kind, data_dir) as (channel, _instance):
        big = b"x" * (4 * 1024 * 1024 + 1)
        outcomes = await channel.add_entries(
            7, [(0, b"a"), (1, big), (2, b"c")], master_key=KEY, last_add_confirmed=-1
        )
        assert [_name(o) for o in outcomes] == ["ok", "EntryTooLarge", "ok"]


@contextlib.asynccontextmanager
async def _serve_at(data_dir: Path, port: int) -> AsyncIterator[tuple[Server, int]]:
    async with pora.open_node(data_dir) as node, trio.open_nursery() as nursery:
        server = Server(node, ServerConfig(port=port))
        _host, bound = await nursery.start(server.run)
        try:
            yield server, bound
        finally:
            await server.shutdown(drain_timeout_s=5.0)


async def test_a_replaced_data_dir_at_the_same_address_is_refused_unsent(
    tmp_path: Path,
) -> None:
    async with (
        _serve_at(tmp_path / "first", 0) as (_server, port),
        connect_node(f"127.0.0.1:{port}", timeout_s=10, backoff_initial_s=0.01) as client,
    ):
        channel = TcpChannel(client)
        recorded = (await channel.identity()).instance_id
        await channel.add_entries(7, [(0, b"a")], master_key=KEY, last_add_confirmed=-1)
        await _server.shutdown(drain_timeout_s=5.0)
        # the node comes back at the same address with an empty data dir
        async with _serve_at(tmp_path / "wiped", port) as (server, _port):
            for call in (
                channel.read_entry(7, 0, fence_key=KEY, instance_id=recorded),
                channel.read_lac(7, fence_key=KEY, instance_id=recorded),
                channel.add_entries(
                    7, [(1, b"b")], master_key=KEY, last_add_confirmed=0, instance_id=recorded
                ),
            ):
                with pytest.raises(pora.InstanceMismatch, match="data dir was replaced"):
                    await call
            counts = server.statistics().requests_by_opcode
            sent = sum(counts.values()) - counts["info"]
            assert sent == 0  # nothing but the client's INFO reached the new node
            assert (await channel.identity()).instance_id != recorded
