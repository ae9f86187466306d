"""`NodeClient.add_entries` and `add_run` over ADD_RUN frames, against a live node."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import trio
from net_helpers import serving

import pora
from netio import codec
from netio import frames as f
from netio.messages import AddRun, AddRunResponse, Info, InfoResponse
from pora.client.node_client import connect_node
from pora.server.server import Server


def payload(entry_id: int, tag: bytes = b"p") -> bytes:
    return tag + b"-%d" % entry_id * (entry_id % 5 + 1)


def opcode_counts(server: Server) -> dict[str, int]:
    return dict(server.statistics().requests_by_opcode)


async def test_add_entries_sends_runs_and_every_entry_reads_back(data_dir: Path) -> None:
    async with serving(data_dir) as (_node, server, address), connect_node(address) as client:
        entries = [(i, payload(i)) for i in range(2000)]
        before = opcode_counts(server)
        assert await client.add_entries(3, entries, password="pw") == [None] * 2000
        after = opcode_counts(server)
        assert after["add_run"] - before["add_run"] == 2  # 1024 + 976 entries
        assert after["add_entry"] == before["add_entry"]
        assert await client.read_range(3, 0, 1999, max_entries=5000) == entries


async def test_runs_are_cut_to_the_nodes_smaller_frame_limit(data_dir: Path) -> None:
    # the client keeps its default limit; the node's, 64 KiB, came with the INFO the
    # client asks first on a connection
    async with (
        serving(data_dir, frame_bytes_max=64 * 1024) as (node, server, address),
        connect_node(address) as client,
    ):
        entries = [(i, bytes([i % 251]) * 2000) for i in range(100)]
        before = opcode_counts(server)
        assert await client.add_entries(1, entries[:50], password="pw") == [None] * 50
        assert await client.add_entries(1, entries[50:], password="pw") == [None] * 50
        after = opcode_counts(server)
        # (65536 - 41 header bytes - 32 key bytes) // (4 + 2000) = 32 entries a frame
        assert after["add_run"] - before["add_run"] == 2 + 2
        assert after["info"] - before["info"] == 0
        assert await node.read_range(1, 0, 99, max_entries=100, max_bytes=1 << 20) == entries
        # a run whose frame is exactly the limit goes whole; one byte more splits it
        exact = [(100, b"a" * 65_000), (101, b"b" * (65_536 - 41 - 32 - 8 - 65_000))]
        assert await client.add_entries(1, exact, password="pw") == [None, None]
        over = [(102, b"a" * 65_001), (103, exact[1][1])]
        assert await client.add_entries(1, over, password="pw") == [None, None]
        assert opcode_counts(server)["add_run"] - after["add_run"] == 1 + 2
        assert server.statistics().protocol_errors == 0


async def test_sparse_and_unordered_ids_make_shorter_runs_with_exact_outcomes(
    data_dir: Path,
) -> None:
    async with (
        serving(data_dir) as (node, server, address),
        connect_node(address) as client,
    ):
        await client.add_entries(2, [(6, b"stored before"), (11, payload(11))])
        await client.add_entry(2, 29, b"stored before")
        ids = [10, 11, 5, 6, 7, 30, 29, 28, 100]  # runs: 10-11, 5-7, 30, 29, 28, 100
        before = opcode_counts(server)
        outcomes = await client.add_entries(2, [(i, payload(i)) for i in ids])
        assert opcode_counts(server)["add_run"] - before["add_run"] == 6
        failed = {ids[index]: o for index, o in enumerate(outcomes) if o is not None}
        assert set(failed) == {6, 29}
        for entry_id, error in failed.items():
            assert isinstance(error, pora.EntryConflict)
            assert (error.ledger_id, error.entry_id) == (2, entry_id)
        stored = dict(await node.read_range(2, 0, 100))
        assert stored == {
            **{i: payload(i) for i in ids},
            6: b"stored before",
            29: b"stored before",
        }


async def test_a_retry_with_other_bytes_fails_exactly_those_entries(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address), connect_node(address) as client:
        first = [(i, payload(i)) for i in range(300)]
        assert await client.add_entries(4, first, password="pw") == [None] * 300
        changed = {3, 150, 299}
        retry = [(i, payload(i, b"other") if i in changed else p) for i, p in first]
        outcomes = await client.add_entries(4, retry, password="pw")
        for entry_id, outcome in enumerate(outcomes):
            if entry_id in changed:
                assert isinstance(outcome, pora.EntryConflict)
                assert outcome.entry_id == entry_id
                assert f"entry {entry_id} of ledger 4 is already stored" in str(outcome)
            else:
                assert outcome is None
        assert await node.read_range(4, 0, 299, max_entries=300) == first


async def test_a_wrong_password_fails_every_entry_and_stores_nothing(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address), connect_node(address) as client:
        await client.add_entries(5, [(0, b"a"), (1, b"b")], password="right")
        outcomes = await client.add_entries(
            5, [(i, payload(i)) for i in range(2, 1502)], password="wrong"
        )
        assert len(outcomes) == 1500
        assert all(isinstance(o, pora.Unauthorized) for o in outcomes)
        assert len({id(o) for o in outcomes}) == 1500  # each its own exception object
        assert "wrong master key for ledger 5" in str(outcomes[-1])
        assert await node.read_range(5, 0, 2000) == [(0, b"a"), (1, b"b")]


async def test_an_entry_over_entry_bytes_max_refuses_its_whole_run(data_dir: Path) -> None:
    async with (
        serving(data_dir, node_options={"entry_bytes_max": 1024}) as (node, _server, address),
        connect_node(address) as client,
    ):
        entries = [(i, b"x" * (2000 if i == 5 else 10)) for i in range(10)]
        entries += [(i, b"y") for i in (20, 21, 22)]  # another run: unaffected
        outcomes = await client.add_entries(6, entries)
        assert outcomes[10:] == [None] * 3
        for outcome in outcomes[:10]:
            assert isinstance(outcome, pora.EntryTooLarge)
            assert outcome.entry_id == 5  # every entry of the run names the culprit
            assert "entry_bytes_max" in str(outcome)
            assert (outcome.size, outcome.limit) == (-1, -1)  # in the message, not the wire
        assert [e for e, _ in await node.read_range(6, 0, 30)] == [20, 21, 22]


async def test_an_entry_too_large_for_any_frame_fails_as_it_always_did(data_dir: Path) -> None:
    async with (
        serving(data_dir, frame_bytes_max=64 * 1024) as (node, _server, address),
        connect_node(address) as client,
    ):
        entries = [(i, b"s") for i in range(10)] + [(10, b"x" * 100_000)]
        outcomes = await client.add_entries(7, entries)
        assert outcomes[:10] == [None] * 10  # sent in their own run, before it
        assert isinstance(outcomes[10], pora.EntryTooLarge)
        assert "exceeds this peer's limit of 65536 bytes (frame_bytes_max)" in str(outcomes[10])
        assert [e for e, _ in await node.read_range(7, 0, 10)] == list(range(10))


async def test_add_run_returns_per_entry_outcomes_and_raises_whole_run_errors(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, server, address), connect_node(address) as client:
        assert await client.add_run(8, 0, [b"a", b"b", b"c"], password="pw") == [None] * 3
        outcomes = await client.add_run(
            8, 1, [b"b", b"other", b"d"], password="pw", last_add_confirmed=0
        )
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], pora.EntryConflict)
        assert await client.last_add_confirmed(8) == 0
        with pytest.raises(pora.Unauthorized, match="wrong master key for ledger 8"):
            await client.add_run(8, 4, [b"e"], password="wrong")
        before = opcode_counts(server)["add_run"]
        for count in (0, f.RUN_ENTRIES_MAX + 1):
            with pytest.raises(pora.InvalidArgument, match="a run carries 1 to 1024 entries"):
                await client.add_run(8, 4, [b"e"] * count, password="pw")
        assert opcode_counts(server)["add_run"] == before  # refused before sending
        await client.fence_ledger(8, password="pw")
        with pytest.raises(pora.LedgerFenced):
            await client.add_run(8, 4, [b"e"], password="pw")
        assert await client.add_run(8, 4, [b"e"], password="pw", recovery=True) == [None]
        assert [p for _, p in await node.read_range(8, 0, 9)] == [b"a", b"b", b"c", b"d", b"e"]


def _add_entries_session(address: str, backend: str) -> list[tuple[int, bytes]]:
    async def main() -> list[tuple[int, bytes]]:
        async with connect_node(address) as client:
            ids = [*range(1500), 3000, 2999, 5000]
            outcomes = await client.add_entries(9, [(i, payload(i)) for i in ids])
            assert outcomes == [None] * len(ids)
            retried = await client.add_entries(9, [(0, b"changed"), (1, payload(1))])
            assert isinstance(retried[0], pora.EntryConflict) and retried[1] is None
            return await client.read_range(9, 0, 5000, max_entries=5000)

    return anyio.run(main, backend=backend)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_add_entries_works_under_asyncio_and_trio(data_dir: Path, backend: str) -> None:
    async with serving(data_dir) as (_node, _server, address):
        stored = await trio.to_thread.run_sync(_add_entries_session, address, backend)
        assert stored == [(i, payload(i)) for i in [*range(1500), 2999, 3000, 5000]]


async def test_a_lost_connection_or_a_silent_node_fails_add_entries_as_other_calls() -> None:
    """A fake node: answers INFO; on its first connection hangs up at the first run,
    on its second swallows runs, on later ones answers them OK."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    seen: list[tuple[int, str]] = []
    connections = 0

    async def fake_node(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        number = connections
        decoder = codec.RequestDecoder()
        while data := await stream.receive_some(65536):
            decoder.receive_data(bytes(data))
            for request in decoder.next_requests(10_000):
                seen.append((number, type(request).__name__))
                if isinstance(request, Info):
                    info = InfoResponse(request.request_id, 2, None, 1 << 20, 1 << 20, 0, "fake")
                    await stream.send_all(codec.encode_response(info))
                elif number == 1:
                    return  # the connection drops with the runs in flight
                elif number > 2 and isinstance(request, AddRun):
                    response = AddRunResponse(
                        request.request_id,
                        request.ledger_id,
                        request.first_entry_id,
                        len(request.payloads),
                    )
                    await stream.send_all(codec.encode_response(response))

    entries = [(i, b"x") for i in range(1500)]
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, fake_node, listeners)
        async with connect_node(address, backoff_initial_s=0.01) as client:
            with pytest.raises(pora.ConnectionLost, match="may or may not have been performed"):
                await client.add_entries(1, entries)
            with pytest.raises(pora.RequestTimeout, match=r"within 0\.2 s"):
                await client.add_entries(1, entries, timeout_s=0.2)  # reconnects, then waits
            assert (await client.info()).server_version == "fake"  # the connection serves on
            assert client.reconnects == 1
        async with connect_node(address) as client:
            assert await client.add_entries(1, entries) == [None] * 1500
        nursery.cancel_scope.cancel()
    # each connection asks the node's frame limit once, then sends its two runs
    assert [name for number, name in seen if number == 1] == ["Info", "AddRun"]
    assert [name for number, name in seen if number == 2] == ["Info", "AddRun", "AddRun", "Info"]
    assert [name for number, name in seen if number == 3] == ["Info", "AddRun", "AddRun"]
