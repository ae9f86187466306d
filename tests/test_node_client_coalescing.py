"""Concurrent `add_entry` calls to one node share frames, each keeping its own outcome."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from net_helpers import serving

import pora
from netio.codec import encode_response
from netio.messages import Info, InfoResponse
from netio.request_codec import RequestDecoder
from pora.client.node_channel import AddRequest
from pora.client.node_client import connect_node
from pora.client.tcp_channel import TcpChannel
from pora.server.server import Server

KEY = b"k" * 32
ADD_OPCODES = ("add_entry", "add_run", "add_batch")


def add_frames(server: Server) -> int:
    counts = server.statistics().requests_by_opcode
    return sum(counts[name] for name in ADD_OPCODES)


async def test_500_concurrent_adds_go_in_few_frames_and_a_conflict_fails_only_its_caller(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, server, address), connect_node(address) as client:
        await node.add_entry(3, 250, b"stored before", master_key=KEY)
        before = add_frames(server)
        outcomes: dict[int, str] = {}

        async def add(entry_id: int) -> None:
            try:
                await client.add_entry(3, entry_id, b"p%d" % entry_id, master_key=KEY)
            except pora.PoraError as error:
                outcomes[entry_id] = type(error).__name__
            else:
                outcomes[entry_id] = "ok"

        async with trio.open_nursery() as nursery:
            for entry_id in range(500):
                nursery.start_soon(add, entry_id)
        frames = add_frames(server) - before
        assert frames <= 25, frames  # far fewer frames than calls
        assert outcomes == {i: "EntryConflict" if i == 250 else "ok" for i in range(500)}
        stored = await node.read_range(3, 0, 499, max_entries=1000)
        assert len(stored) == 500
        assert stored[250] == (250, b"stored before")
        assert stored[499] == (499, b"p499")


async def test_sparse_ids_of_many_callers_travel_as_batches(data_dir: Path) -> None:
    async with serving(data_dir) as (node, server, address), connect_node(address) as client:
        ids = list(range(0, 300, 3))  # one node's share of a striped ensemble

        async def add(entry_id: int) -> None:
            await client.add_entry(4, entry_id, b"x", master_key=KEY)

        async with trio.open_nursery() as nursery:
            for entry_id in ids:
                nursery.start_soon(add, entry_id)
        counts = server.statistics().requests_by_opcode
        assert counts["add_batch"] >= 1
        assert counts["add_entry"] + counts["add_batch"] + counts["add_run"] < 20
        assert [e for e, _ in await node.read_range(4, 0, 299)] == ids


async def test_callers_of_many_ledgers_and_keys_each_get_their_own_refusal(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address), connect_node(address) as client:
        await node.fence_ledger(5, master_key=KEY)
        await node.add_entry(6, 100, b"keyed", master_key=KEY)
        results: dict[tuple[int, int], str] = {}

        async def add(ledger_id: int, entry_id: int, key: bytes) -> None:
            try:
                await client.add_entry(ledger_id, entry_id, b"v", master_key=key)
            except pora.PoraError as error:
                results[ledger_id, entry_id] = type(error).__name__
            else:
                results[ledger_id, entry_id] = "ok"

        async with trio.open_nursery() as nursery:
            for entry_id in range(20):
                nursery.start_soon(add, 5, entry_id, KEY)  # fenced: all refused
                nursery.start_soon(add, 6, entry_id, KEY)
            nursery.start_soon(add, 6, 20, b"w" * 32)  # another key: refused alone
        assert {results[5, i] for i in range(20)} == {"LedgerFenced"}
        assert {results[6, i] for i in range(20)} == {"ok"}
        assert results[6, 20] == "Unauthorized"


async def test_a_coalesced_add_times_out_on_its_own_deadline(data_dir: Path) -> None:
    """The node takes the adds but never answers: each call ends at its timeout."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def never_answer(stream: trio.SocketStream) -> None:
        while await stream.receive_some(65536):
            pass

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, never_answer, listeners)
        async with connect_node(f"127.0.0.1:{port}", timeout_s=0.2) as client:
            with trio.fail_after(5):
                try:
                    await client.add_entry(1, 0, b"x")
                except pora.RequestTimeout as error:
                    assert "may or may not" in str(error)
                else:
                    raise AssertionError("no timeout")
        nursery.cancel_scope.cancel()


async def test_framed_adds_time_out_each_on_its_own_deadline(data_dir: Path) -> None:
    """The node answers who it is, takes the add frames and never answers them: each
    caller ends at its own timeout, swept from the frames in flight."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    frames_seen = 0

    async def answer_info_only(stream: trio.SocketStream) -> None:
        nonlocal frames_seen
        decoder = RequestDecoder()
        while data := await stream.receive_some(65536):
            decoder.receive_data(data)
            for request in decoder.next_requests(1000):
                frames_seen += 1
                if isinstance(request, Info):
                    info = InfoResponse(request.request_id, 4, None, 1 << 24, 1 << 20, 0, "t", "i")
                    await stream.send_all(encode_response(info, decoder.version or 4))

    ended: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, answer_info_only, listeners)
        async with connect_node(f"127.0.0.1:{port}", timeout_s=5) as client:
            await client.identity()
            started = trio.current_time()

            async def add(name: str, entry_id: int, timeout_s: float) -> None:
                with pytest.raises(pora.RequestTimeout):
                    await client.add_entry(1, entry_id, b"x", timeout_s=timeout_s)
                ended[name] = trio.current_time() - started

            with trio.fail_after(5):
                async with trio.open_nursery() as adds:
                    adds.start_soon(add, "short", 0, 0.1)
                    adds.start_soon(add, "long", 1, 0.5)
        nursery.cancel_scope.cancel()
    assert frames_seen >= 2  # the INFO, and the adds' frame: they were in flight
    assert 0.1 <= ended["short"] < 0.4
    assert 0.5 <= ended["long"] < 1.5


async def test_a_multi_ledger_add_is_one_wait_and_each_ledger_gets_its_own_outcomes(
    data_dir: Path,
) -> None:
    """`TcpChannel.add_entries_many` (the replicating writer's call per node per turn):
    several ledgers' adds as one caller; a ledger's refusal and an entry's conflict
    reach that ledger's, that entry's outcome only."""
    async with serving(data_dir) as (node, _, address), connect_node(address) as client:
        await node.add_entry(5, 0, b"first", master_key=KEY)
        await node.fence_ledger(6, master_key=KEY)  # a recovery took ledger 6
        await node.add_entry(7, 1, b"stored before", master_key=KEY)
        requests = [
            AddRequest(5, [(1, b"a"), (2, b"b")], KEY, 0),
            AddRequest(6, [(0, b"c")], KEY, -1),
            AddRequest(7, [(0, b"d"), (1, b"other bytes"), (2, b"e")], KEY, -1),
        ]
        answers = await TcpChannel(client).add_entries_many(requests)
        assert isinstance(answers[1], list) and isinstance(answers[2], list)
        assert answers[0] is None  # every entry stored: one fact, no outcome per entry
        assert [type(outcome).__name__ for outcome in answers[1]] == ["LedgerFenced"]
        assert [type(outcome).__name__ for outcome in answers[2]] == [
            "NoneType",
            "EntryConflict",
            "NoneType",
        ]
        assert await node.read_range(5, 0, 2) == [(0, b"first"), (1, b"a"), (2, b"b")]
        assert await node.read_range(7, 0, 2) == [(0, b"d"), (1, b"stored before"), (2, b"e")]
