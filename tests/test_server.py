"""The network workers on a real socket: what a client of a live node relies on."""

from __future__ import annotations

import logging
import random
import socket
import struct
import tracemalloc
from pathlib import Path

import pytest
import trio
from net_helpers import raw_connection, receive_responses, serving
from waiting import wait_until

import pora
from netio import codec
from netio import frames as f
from netio.messages import (
    AddEntryResponse,
    ErrorResponse,
    Info,
    InfoResponse,
    ReadEntry,
    ReadEntryResponse,
    ReadRange,
    ReadRangeResponse,
)
from pora.client.node_client import connect_node
from pora.server.server import ServerConfig


async def test_pipelining_thousands_of_adds_on_one_connection(data_dir: Path) -> None:
    count = 5000
    async with serving(data_dir) as (_node, server, address):
        stream = await raw_connection(address)
        frames = [
            codec.encode_add_entry(
                10_000 + i, 3, i, i.to_bytes(4, "big") * 64, last_add_confirmed=i - 1
            )
            for i in range(count)
        ]
        await stream.send_all(b"".join(frames))  # all at once: the node reads ahead, bounded
        responses, closed = await receive_responses(stream, count)
        assert not closed
        assert all(isinstance(r, AddEntryResponse) for r in responses)
        assert sorted(r.request_id for r in responses) == list(range(10_000, 10_000 + count))
        # every add is stored, with its bytes
        await stream.send_all(codec.encode_request(ReadRange(1, 3, 0, count - 1, 10_000, 1 << 22)))
        (read,), _ = await receive_responses(stream, 1)
        assert isinstance(read, ReadRangeResponse)
        assert read.entries == [(i, i.to_bytes(4, "big") * 64) for i in range(count)]
        stats = server.statistics()
        assert stats.requests_by_opcode["add_entry"] == count
        assert stats.responses_by_status["ok"] == count + 1
        await stream.aclose()


async def test_a_malformed_frame_gets_bad_request_and_its_connection_closes(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (_node, server, address), connect_node(address) as client:
        stream = await raw_connection(address)
        bad = f.HEADER.pack(12, f.PROTOCOL_VERSION, 99, 0, 0, 77)  # opcode 99 does not exist
        await stream.send_all(codec.encode_request(Info(76)) + bad + codec.encode_request(Info(78)))
        responses, closed = await receive_responses(stream, 3)
        assert closed
        # responses come in completion order: match them by request id
        by_id = {r.request_id: r for r in responses}
        assert isinstance(by_id[76], InfoResponse)
        error = by_id[77]
        assert isinstance(error, ErrorResponse)
        assert (error.request_id, error.status) == (77, f.Status.BAD_REQUEST)
        assert "unknown opcode 99" in error.message
        assert len(responses) == 2  # nothing after the bad frame is served
        # everyone else is still served
        await client.add_entry(1, 0, b"still here")
        assert await client.read_entry(1, 0) == b"still here"
        assert server.statistics().protocol_errors == 1


async def test_a_huge_length_prefix_is_refused_before_its_body(data_dir: Path) -> None:
    async with serving(data_dir, frame_bytes_max=64 * 1024) as (_node, server, address):
        stream = await raw_connection(address)
        # a header claiming 2 GiB, and no body: the node must not wait for it
        await stream.send_all(f.HEADER.pack(2**31, 1, 1, 0, 0, 5))
        responses, closed = await receive_responses(stream, 2)
        assert closed
        (error,) = responses
        assert isinstance(error, ErrorResponse)
        assert (error.request_id, error.status) == (5, f.Status.TOO_LARGE)
        assert "frame_bytes_max" in error.message
        assert server.statistics().bytes_buffered == 0


async def test_node_wide_in_flight_limit_answers_overloaded(data_dir: Path) -> None:
    async with serving(data_dir, inflight_node_max=10) as (_node, _server, address):
        stream = await raw_connection(address)
        await stream.send_all(b"".join(codec.encode_add_entry(i, 1, i, b"x") for i in range(50)))
        responses, _ = await receive_responses(stream, 50)
        statuses = [r.status if isinstance(r, ErrorResponse) else f.Status.OK for r in responses]
        assert statuses.count(f.Status.OK) >= 10
        assert f.Status.OVERLOADED in statuses
        overloaded = next(r for r in responses if isinstance(r, ErrorResponse))
        assert "inflight_node_max" in overloaded.message


async def test_connections_over_the_limit_are_told_and_closed(data_dir: Path) -> None:
    async with serving(data_dir, connections_max=2) as (_node, server, address):
        first = await raw_connection(address)
        second = await raw_connection(address)
        await first.send_all(codec.encode_request(Info(1)))
        await second.send_all(codec.encode_request(Info(1)))
        await receive_responses(first, 1)
        await receive_responses(second, 1)
        third = await raw_connection(address)
        responses, closed = await receive_responses(third, 2)
        assert closed
        (refusal,) = responses
        assert isinstance(refusal, ErrorResponse)
        assert (refusal.request_id, refusal.status) == (0, f.Status.OVERLOADED)
        assert server.statistics().connections_refused == 1
        await first.aclose()
        await second.aclose()


async def test_an_idle_connection_is_closed(data_dir: Path, autojump_clock: trio.abc.Clock) -> None:
    async with serving(data_dir, idle_timeout_s=30.0) as (_node, server, address):
        stream = await raw_connection(address)
        await stream.send_all(codec.encode_request(Info(1)))
        await receive_responses(stream, 1)
        start = trio.current_time()
        with trio.fail_after(120):
            assert await stream.receive_some(100) == b""
        assert trio.current_time() - start >= 30.0
        assert server.statistics().connections_open == 0


async def _abuse(address: str, seed: int, stop: trio.Event) -> int:
    """Send garbage of several kinds on fresh connections until told to stop."""
    rng = random.Random(seed)
    rounds = 0
    while not stop.is_set():
        try:
            stream = await raw_connection(address)
        except OSError:
            await trio.sleep(0.01)
            continue
        kind = rounds % 4
        try:
            if kind == 0:  # random bytes
                await stream.send_all(rng.randbytes(rng.randrange(1, 4000)))
            elif kind == 1:  # a huge length prefix
                await stream.send_all(struct.pack(">I", rng.randrange(2**20, 2**32)))
            elif kind == 2:  # a truncated frame, left hanging
                frame = codec.encode_add_entry(1, 9, rounds, rng.randbytes(30_000))
                await stream.send_all(frame[: rng.randrange(1, len(frame))])
            else:  # valid frames, then garbage
                await stream.send_all(codec.encode_request(Info(3)) + rng.randbytes(100))
            with trio.move_on_after(0.05):
                await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)
        rounds += 1
    return rounds


@pytest.mark.slow
async def test_garbage_on_many_connections_does_not_disturb_a_good_client(
    data_dir: Path,
) -> None:
    frame_max = 64 * 1024
    receive_max = 16 * 1024
    async with serving(data_dir, frame_bytes_max=frame_max, receive_bytes_max=receive_max) as (
        _node,
        server,
        address,
    ):
        stop = trio.Event()
        peak_buffered = 0
        rounds: list[int] = []
        tracemalloc.start()
        try:
            baseline, _ = tracemalloc.get_traced_memory()
            async with trio.open_nursery() as nursery:

                async def abuser(seed: int) -> None:
                    rounds.append(await _abuse(address, seed, stop))

                for seed in range(10):
                    nursery.start_soon(abuser, seed)
                async with connect_node(address) as client:
                    for i in range(100):
                        await client.add_entry(5, i, f"good-{i}".encode())
                        if i % 20 == 0:
                            peak_buffered = max(peak_buffered, server.statistics().bytes_buffered)
                    assert [e for _, e in await client.read_range(5, 0, 99)] == [
                        f"good-{i}".encode() for i in range(100)
                    ]
                stop.set()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        stats = server.statistics()
        assert sum(rounds) >= 20
        assert stats.protocol_errors >= 10
        # each connection holds at most one frame plus one read, and they all went away
        assert peak_buffered <= 11 * (frame_max + receive_max)
        assert peak - baseline < 64 * 1024 * 1024
        await wait_until(lambda: not server.statistics().connections_open, 5.0)
        assert server.statistics().bytes_buffered == 0


async def test_shutdown_answers_requests_in_flight_then_closes(data_dir: Path) -> None:
    async with serving(data_dir) as (_node, server, address):
        stream = await raw_connection(address)
        await stream.send_all(
            b"".join(codec.encode_add_entry(i, 2, i, b"y" * 100) for i in range(500))
        )
        await wait_until(lambda: server.statistics().requests_by_opcode["add_entry"] == 500, 10.0)
        await server.shutdown(drain_timeout_s=5.0)
        responses, closed = await receive_responses(stream, 501)
        assert closed
        assert len(responses) == 500
        assert all(isinstance(r, AddEntryResponse) for r in responses)


async def test_info_over_the_wire_describes_the_node(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address), connect_node(address) as client:
        await client.add_entry(4, 0, b"a")
        info = await client.info()
        assert info.protocol_version == f.PROTOCOL_VERSION
        assert info.server_version == pora.__version__
        assert info.entry_bytes_max == node.config.entry_bytes_max
        assert info.ledger_count == 1
        assert info.read_only_reason is None


async def test_pipelined_range_reads_are_bounded_and_all_answered(data_dir: Path) -> None:
    budget = 64 * 1024
    async with serving(data_dir, inflight_bytes_per_connection_max=budget) as (
        node,
        server,
        address,
    ):
        await node.add_entries([(6, i, bytes([i]) * 1024) for i in range(100)])
        stream = await raw_connection(address)
        count = 300
        await stream.send_all(
            b"".join(
                codec.encode_request(ReadRange(i, 6, 0, 99, 1000, budget)) for i in range(count)
            )
        )
        responses, closed = await receive_responses(stream, count)
        assert not closed
        assert sorted(r.request_id for r in responses) == list(range(count))
        for response in responses:
            assert isinstance(response, ReadRangeResponse)
            # each response keeps within its byte limit, and starts at the first entry
            assert response.entries[0] == (0, bytes(1024))
            assert sum(len(p) for _, p in response.entries) <= budget
        assert server.statistics().responses_by_status["ok"] == count
        await stream.aclose()


async def test_a_peer_vanishing_mid_pipeline_is_routine(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(data_dir) as (_node, server, address), connect_node(address) as client:
        for _ in range(5):
            stream = await raw_connection(address)
            await stream.send_all(
                b"".join(codec.encode_add_entry(i, 1, i, b"z" * 512) for i in range(2000))
            )
            await trio.aclose_forcefully(stream)  # gone before reading a single response
        await client.add_entry(2, 0, b"fine")
        assert await client.read_entry(2, 0) == b"fine"
        await wait_until(lambda: server.statistics().connections_open == 1, 10.0)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_shutdown_ends_long_polls_at_once(data_dir: Path) -> None:
    async with serving(data_dir) as (node, server, address):
        await node.add_entry(1, 0, b"a")
        stream = await raw_connection(address)
        await stream.send_all(
            codec.encode_request(ReadEntry(1, 1, 5, wait_ms=60_000))  # waits for entry 5
            + codec.encode_request(ReadEntry(2, 1, 0))
        )
        await wait_until(lambda: server.statistics().requests_by_opcode["read_entry"] == 2, 10.0)
        start = trio.current_time()
        await server.shutdown(drain_timeout_s=30.0)
        assert trio.current_time() - start < 5.0  # not the minute the poll asked for
        responses, closed = await receive_responses(stream, 3)
        assert closed
        by_id = {r.request_id: r for r in responses}
        assert isinstance(by_id[2], ReadEntryResponse) and by_id[2].payload == b"a"
        poll = by_id[1]
        assert isinstance(poll, ErrorResponse)
        assert poll.status == f.Status.SHUTTING_DOWN
        assert "shutting down" in poll.message


async def test_a_stalled_half_frame_does_not_hold_its_buffer_forever(
    data_dir: Path, autojump_clock: trio.abc.Clock
) -> None:
    async with serving(data_dir, idle_timeout_s=30.0) as (_node, server, address):
        stream = await raw_connection(address)
        frame = codec.encode_add_entry(1, 1, 0, b"p" * 100_000)
        await stream.send_all(frame[:50_000])  # half a frame, then silence
        await wait_until(lambda: server.statistics().bytes_buffered >= 50_000, 10.0)
        with trio.fail_after(120):
            assert await stream.receive_some(100) == b""  # closed after the idle timeout
        assert server.statistics().bytes_buffered == 0


def test_server_config_refuses_what_cannot_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both tls_cert_file and tls_key_file"):
        ServerConfig(tls_cert_file="node.crt")
    with pytest.raises(ValueError, match="inflight_node_max must be at least 1"):
        ServerConfig(inflight_node_max=0)
    missing = ServerConfig(
        tls_cert_file=str(tmp_path / "no.crt"), tls_key_file=str(tmp_path / "no.key")
    )
    with pytest.raises(ValueError, match=r"cannot load the TLS certificate .*no\.crt"):
        missing.ssl_context()


async def test_a_peer_that_never_reads_its_responses_is_cut_off(
    data_dir: Path, autojump_clock: trio.abc.Clock
) -> None:
    async with serving(data_dir, idle_timeout_s=30.0) as (node, server, address):
        await node.add_entry(1, 0, b"r" * 1_000_000)
        stream = await raw_connection(address)
        # 100 MB of responses it will never read: the node's sends block
        await stream.send_all(
            b"".join(codec.encode_request(ReadEntry(i, 1, 0)) for i in range(100))
        )
        with trio.fail_after(120):
            while server.statistics().connections_open:  # noqa: ASYNC110
                await trio.sleep(1.0)
        assert server.statistics().requests_inflight == 0
        await trio.aclose_forcefully(stream)


async def test_each_add_of_a_pipelined_run_gets_its_own_answer(data_dir: Path) -> None:
    """Adds in a row to one ledger become one run in the node; a retry in the middle
    with other bytes fails only that add, with its own request id."""

    def payload(entry_id: int) -> bytes:
        return entry_id.to_bytes(2, "big") * 50

    async with serving(data_dir) as (node, server, address):
        assert await node.add_entries([(3, e, payload(e)) for e in range(10)]) == [None] * 10
        stream = await raw_connection(address)
        adds = {500 + e: e for e in range(5, 21)}  # request id -> entry id: 5..9 are retries
        await stream.send_all(
            b"".join(
                codec.encode_add_entry(
                    request_id, 3, e, b"different" if e == 7 else payload(e), last_add_confirmed=4
                )
                for request_id, e in adds.items()
            )
        )
        responses, closed = await receive_responses(stream, len(adds))
        assert not closed
        by_id = {r.request_id: r for r in responses}
        assert sorted(by_id) == sorted(adds)
        conflict = by_id.pop(507)
        assert isinstance(conflict, ErrorResponse)
        assert (conflict.status, conflict.ledger_id, conflict.entry_id) == (
            f.Status.ENTRY_CONFLICT,
            3,
            7,
        )
        assert "entry 7 of ledger 3 is already stored with different bytes" in conflict.message
        for request_id, response in by_id.items():
            assert isinstance(response, AddEntryResponse)
            assert (response.ledger_id, response.entry_id) == (3, adds[request_id])
        # the conflicting add changed nothing, every other one is stored
        assert [p for _, p in await node.read_range(3, 0, 100)] == [payload(e) for e in range(21)]
        statuses = server.statistics().responses_by_status
        assert (statuses["ok"], statuses["entry_conflict"]) == (len(adds) - 1, 1)
        await stream.aclose()


async def test_a_wrong_master_key_fails_every_add_of_a_run(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(4, 0, b"first", master_key=b"right")
        stream = await raw_connection(address)
        wrong = [
            codec.encode_add_entry(100 + e, 4, e, b"w", master_key=b"wrong") for e in range(1, 9)
        ]
        # then the same ledger's next adds with the right key: a run of their own
        right = [
            codec.encode_add_entry(200 + e, 4, e, b"r", master_key=b"right") for e in range(1, 4)
        ]
        await stream.send_all(b"".join(wrong + right))
        responses, closed = await receive_responses(stream, len(wrong) + len(right))
        assert not closed
        by_id = {r.request_id: r for r in responses}
        assert sorted(by_id) == [*range(101, 109), *range(201, 204)]
        for request_id in range(101, 109):
            refused = by_id[request_id]
            assert isinstance(refused, ErrorResponse)
            assert (refused.status, refused.ledger_id) == (f.Status.UNAUTHORIZED, 4)
            assert "wrong master key for ledger 4" in refused.message
        for request_id in range(201, 204):
            accepted = by_id[request_id]
            assert isinstance(accepted, AddEntryResponse)
            assert accepted.entry_id == request_id - 200
        assert await node.read_range(4, 0, 100) == [(0, b"first"), (1, b"r"), (2, b"r"), (3, b"r")]
        await stream.aclose()


async def test_responses_to_a_slow_reader_arrive_whole_and_in_full(data_dir: Path) -> None:
    # responses go out from the task that completed them while the socket takes
    # them; a peer that reads late makes those writes partial, and the writer task
    # must send the rest first, byte-exact, before anything else
    count = 6_000
    async with serving(data_dir) as (_node, server, address):
        stream = await raw_connection(address)
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        # small buffers at both ends, fixed (no autotuning): the responses cannot fit
        await wait_until(lambda: bool(server._connections), 10.0)
        (connection,) = server._connections
        assert isinstance(connection.stream, trio.SocketStream)
        connection.stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        frames = b"".join(
            codec.encode_add_entry(i, 4, i, b"s", last_add_confirmed=i - 1) for i in range(count)
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, frames)
            # the node meets a full socket first
            await wait_until(lambda: server.statistics().sends_backed_up > 0, 30.0)
            responses, closed = await receive_responses(stream, count, timeout_s=60.0)
        assert not closed
        assert all(isinstance(r, AddEntryResponse) for r in responses)
        assert sorted(r.request_id for r in responses) == list(range(count))
        await stream.aclose()
