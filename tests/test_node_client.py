"""The per-node client against a live node: what an application relies on."""

from __future__ import annotations

import ssl
from pathlib import Path

import anyio
import pytest
import trio
import trio.testing
from net_helpers import self_signed_certificate, serving

import pora
from netio import codec
from netio.messages import AddRun, Info, InfoResponse
from pora.client.node_client import connect_node
from pora.server.server import Server, ServerConfig


async def test_every_operation_round_trips(data_dir: Path) -> None:
    async with serving(data_dir) as (_node, _server, address), connect_node(address) as client:
        await client.add_entry(1, 0, b"zero", password="pw")
        outcomes = await client.add_entries(
            1, [(i, f"entry-{i}".encode()) for i in range(1, 50)], password="pw"
        )
        assert outcomes == [None] * 49
        assert await client.read_entry(1, 0) == b"zero"
        assert await client.read_range(1, 10, 12) == [
            (10, b"entry-10"),
            (11, b"entry-11"),
            (12, b"entry-12"),
        ]
        await client.add_entry(1, 50, b"last", password="pw", last_add_confirmed=49)
        assert await client.last_add_confirmed(1) == 49
        payload, lac = await client.read_entry_and_lac(1, 50)
        assert (payload, lac) == (b"last", 49)
        assert await client.close_ledger(1, password="pw") == 50
        await client.add_entry(2, 0, b"other")
        assert await client.fence_ledger(2) == 0
        ledgers = await client.list_ledgers(page_size=1)  # paged: one ledger a page
        assert [(s.ledger_id, s.state, s.entry_count) for s in ledgers] == [
            (1, "closed", 51),
            (2, "fenced", 1),
        ]
        await client.delete_ledger(2)
        assert [s.ledger_id for s in await client.list_ledgers()] == [1]
        assert (await client.info()).ledger_count == 1


async def test_every_error_status_raises_the_engine_exception(data_dir: Path) -> None:
    async with (
        serving(data_dir, node_options={"entry_bytes_max": 1024}) as (node, _server, address),
        connect_node(address) as client,
    ):
        await client.add_entry(1, 0, b"a", password="right")
        with pytest.raises(pora.NoSuchLedger, match="ledger 9 does not exist"):
            await client.read_entry(9, 0)
        with pytest.raises(pora.NoSuchEntry, match="entry 5 of ledger 1") as missing:
            await client.read_entry(1, 5)
        assert (missing.value.ledger_id, missing.value.entry_id) == (1, 5)
        with pytest.raises(pora.EntryConflict):
            await client.add_entry(1, 0, b"b", password="right")
        with pytest.raises(pora.Unauthorized, match="wrong master key for ledger 1"):
            await client.add_entry(1, 1, b"a", password="wrong")
        with pytest.raises(pora.Unauthorized):
            await client.fence_ledger(1, password="wrong")
        with pytest.raises(pora.Unauthorized):
            await client.close_ledger(1, password="wrong")
        with pytest.raises(pora.EntryTooLarge, match="entry_bytes_max") as too_large:
            await client.add_entry(1, 1, b"x" * 2000, password="right")
        # the node's message names the sizes; the error's fields say they are unknown
        too_large_fields = (too_large.value.ledger_id, too_large.value.entry_id)
        assert too_large_fields == (1, 1)
        assert (too_large.value.size, too_large.value.limit) == (-1, -1)
        with pytest.raises(pora.InvalidArgument):
            await client.add_entry(-1, 0, b"")
        await client.add_entry(2, 0, b"a")
        await client.fence_ledger(2)
        with pytest.raises(pora.LedgerFenced, match="ledger 2 is fenced"):
            await client.add_entry(2, 1, b"b")
        await client.add_entry(2, 1, b"b", recovery=True)  # recovery adds still pass
        await client.close_ledger(2)
        with pytest.raises(pora.LedgerClosed, match="ledger 2 is closed"):
            await client.add_entry(2, 2, b"c", recovery=True)
        node.set_read_only("disk nearly full (test)")
        with pytest.raises(pora.NodeReadOnly, match="disk nearly full"):
            await client.add_entry(3, 0, b"a")
        assert await client.read_entry(1, 0) == b"a"  # reads go on
        assert (await client.info()).read_only_reason == "disk nearly full (test)"
        node.set_read_only(None)
        await client.add_entry(3, 0, b"a")


async def test_internal_errors_and_shutting_down_reach_the_client(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with serving(data_dir) as (node, _server, address), connect_node(address) as client:
        await client.add_entry(1, 0, b"a")

        async def broken_disk(*_args: object, **_kwargs: object) -> bytes:
            raise OSError(5, "Input/output error (injected)")

        async def closing(*_args: object, **_kwargs: object) -> bytes:
            raise pora.NodeClosed("the node is shutting down")

        monkeypatch.setattr(node, "read_entry", broken_disk)
        with pytest.raises(pora.RemoteError, match="Input/output error"):
            await client.read_entry(1, 0)
        monkeypatch.setattr(node, "read_entry", closing)
        with pytest.raises(pora.NodeClosed, match="shutting down"):
            await client.read_entry(1, 0)
        monkeypatch.undo()
        assert await client.read_entry(1, 0) == b"a"  # the connection survived both


async def test_many_concurrent_callers_share_one_connection(data_dir: Path) -> None:
    async with serving(data_dir) as (_node, server, address), connect_node(address) as client:

        async def writer(ledger_id: int) -> None:
            for entry_id in range(20):
                await client.add_entry(ledger_id, entry_id, f"{ledger_id}/{entry_id}".encode())

        async with trio.open_nursery() as nursery:
            for ledger_id in range(100):
                nursery.start_soon(writer, ledger_id)
        assert await client.read_range(57, 0, 19) == [(i, f"57/{i}".encode()) for i in range(20)]
        assert server.statistics().connections_accepted == 1


async def test_long_poll_waits_for_the_entry(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address), connect_node(address) as client:
        await client.add_entry(1, 0, b"first", last_add_confirmed=-1)
        results: list[tuple[bytes, int]] = []

        async def tail_reader() -> None:
            results.append(await client.read_entry_and_lac(1, 1, wait_s=10.0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail_reader)
            # everything is idle: the read crossed the wire and waits in the node
            await trio.testing.wait_all_tasks_blocked()
            polls = node.statistics().long_polls
            assert (polls.long_polls_waiting, polls.ledgers_waited_for) == (1, 1)
            assert not results
            await client.add_entry(1, 1, b"second", last_add_confirmed=0)
        assert results == [(b"second", 0)]
        polls = node.statistics().long_polls  # the poll left nothing behind
        assert (polls.long_polls_waiting, polls.ledgers_waited_for) == (0, 0)
        with pytest.raises(pora.NoSuchEntry):
            await client.read_entry(1, 7, wait_s=0.05)  # the wait runs out


async def test_a_fencing_read_shuts_the_writer_out(data_dir: Path) -> None:
    async with serving(data_dir) as (_node, _server, address), connect_node(address) as client:
        await client.add_entry(4, 0, b"a", password="pw")
        with pytest.raises(pora.Unauthorized):
            await client.read_entry(4, 0, fence=True, password="not it")
        assert await client.read_entry(4, 0, fence=True, password="pw") == b"a"
        with pytest.raises(pora.LedgerFenced):
            await client.add_entry(4, 1, b"b", password="pw")


async def test_a_silent_node_times_the_request_out(data_dir: Path) -> None:
    # a real listener that accepts and reads but never answers
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def swallow(stream: trio.SocketStream) -> None:
        while await stream.receive_some(65536):
            pass

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, swallow, listeners)
        async with connect_node(f"127.0.0.1:{port}", timeout_s=0.2) as client:
            with pytest.raises(pora.RequestTimeout, match=r"within 0\.2 s"):
                await client.add_entry(1, 0, b"lost?")
            with pytest.raises(TimeoutError):  # also a builtin TimeoutError
                await client.info(timeout_s=0.05)
        nursery.cancel_scope.cancel()


async def _run_node(
    data_dir: Path,
    port: int,
    stop: trio.Event,
    stopped: trio.Event,
    *,
    task_status: trio.TaskStatus[int],
) -> None:
    try:
        async with pora.open_node(data_dir) as node, trio.open_nursery() as nursery:
            server = Server(node, ServerConfig(port=port))
            _host, bound = await nursery.start(server.run)
            task_status.started(bound)
            await stop.wait()
            await server.shutdown(drain_timeout_s=1.0)
    finally:
        stopped.set()


async def test_the_client_reconnects_after_the_node_restarts(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    async with trio.open_nursery() as nursery:
        stop, stopped = trio.Event(), trio.Event()
        port = await nursery.start(_run_node, data_dir, 0, stop, stopped)
        async with connect_node(
            f"127.0.0.1:{port}", reconnect_attempts=50, backoff_max_s=0.05
        ) as client:
            await client.add_entry(1, 0, b"before")
            stop.set()  # the node goes away, with the connection
            with pytest.raises(pora.ConnectionLost):
                for _ in range(100):  # until the client notices the closed connection
                    await client.info()
                    await trio.sleep(0.01)
            await stopped.wait()
            stop, stopped = trio.Event(), trio.Event()
            await nursery.start(_run_node, data_dir, port, stop, stopped)
            await client.add_entry(1, 1, b"after")  # reconnects by itself
            assert await client.read_range(1, 0, 1) == [(0, b"before"), (1, b"after")]
            assert client.reconnects == 1
            stop.set()


async def test_connect_to_nothing_fails_with_a_clear_error() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # nobody listens there now
    with pytest.raises(pora.ConnectionLost, match=r"cannot connect to node .* after 2 attempts"):
        async with connect_node(f"127.0.0.1:{port}", reconnect_attempts=2, backoff_initial_s=0.01):
            pass


async def test_tls_protects_the_connection(data_dir: Path, tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    async with serving(data_dir, tls_cert_file=str(cert), tls_key_file=str(key)) as (
        _node,
        _server,
        address,
    ):
        async with connect_node(address, tls_ca_file=str(cert)) as client:
            await client.add_entry(1, 0, b"secret payload", password="pw")
            assert await client.read_entry(1, 0) == b"secret payload"
        # a client that does not trust the certificate cannot connect
        with pytest.raises(pora.ConnectionLost):
            async with connect_node(address, tls=True, reconnect_attempts=1):
                pass
        # nor can a plaintext client talk to it
        with pytest.raises((pora.ConnectionLost, pora.RequestTimeout)):
            async with connect_node(address, timeout_s=1.0, reconnect_attempts=1) as plain:
                await plain.info()
        context = ssl.create_default_context(cafile=str(cert))
        async with connect_node(address, tls=context) as client:
            assert await client.read_entry(1, 0) == b"secret payload"


def _asyncio_session(address: str) -> list[bytes]:
    async def main() -> list[bytes]:
        async with connect_node(address) as client:
            async with anyio.create_task_group() as tasks:
                for i in range(20):
                    tasks.start_soon(client.add_entry, 8, i, f"asyncio {i}".encode())
            with pytest.raises(pora.NoSuchEntry):
                await client.read_entry(8, 99)
            return [payload for _, payload in await client.read_range(8, 0, 19)]

    return anyio.run(main, backend="asyncio")


async def test_the_client_works_under_asyncio(data_dir: Path) -> None:
    async with serving(data_dir) as (_node, _server, address):
        payloads = await trio.to_thread.run_sync(_asyncio_session, address)
        assert payloads == [f"asyncio {i}".encode() for i in range(20)]


async def test_a_node_at_its_connection_limit_says_it_is_overloaded(data_dir: Path) -> None:
    async with (
        serving(data_dir, connections_max=1) as (_node, _server, address),
        connect_node(address) as first,
    ):
        await first.info()
        with pytest.raises(pora.NodeOverloaded, match="connections_max"):
            async with connect_node(address, reconnect_attempts=1) as second:
                for _ in range(100):  # until the refusal has arrived
                    await second.info()
                    await trio.sleep(0.01)
        await first.info()  # the connection it has is unaffected


async def test_a_dropped_connection_fails_every_caller_with_its_own_error() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    received = trio.Event()

    async def read_then_hang_up(stream: trio.SocketStream) -> None:
        decoder = codec.RequestDecoder()
        entries = 0
        while entries < 100:  # every caller's add is in: now drop them all
            decoder.receive_data(bytes(await stream.receive_some(65536)))
            for request in decoder.next_requests(1000):
                if isinstance(request, Info):  # the client asks who the node is first
                    info = InfoResponse(request.request_id, 4, None, 1 << 22, 1 << 20, 0, "", "")
                    await stream.send_all(codec.encode_response(info))
                elif isinstance(request, AddRun):
                    entries += len(request.payloads)
                else:
                    entries += 1
        received.set()

    errors: list[BaseException] = []

    async def caller(client: pora.NodeClient, entry_id: int) -> None:
        try:
            await client.add_entry(1, entry_id, b"x")
        except pora.ConnectionLost as error:
            errors.append(error)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, read_then_hang_up, listeners)
        async with connect_node(f"127.0.0.1:{port}") as client, trio.open_nursery() as callers:
            for entry_id in range(100):
                callers.start_soon(caller, client, entry_id)
        nursery.cancel_scope.cancel()
    assert received.is_set()
    assert len(errors) == 100
    assert len({id(e) for e in errors}) == 100  # no traceback piling up on a shared one
    assert all("may or may not have been performed" in str(e) for e in errors)
