"""A replicating writer's batches (`TcpChannel.add_entries_many`, the per-node client's
`add_batches_many`) go straight into ADD_RUN / ADD_BATCH frames: one frame per batch
that fits, cut where it does not, and answered per frame."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from net_helpers import serving

import pora
from netio import frames as f
from netio.codec import encode_response
from netio.messages import Info, InfoResponse
from netio.request_codec import RequestDecoder
from pora.client.ledger_frames import BatchCall, encode_batches, entry_sizes
from pora.client.node_channel import AddRequest
from pora.client.node_client import connect_node
from pora.client.tcp_channel import TcpChannel

KEY = b"k" * 32


class _Unsent(BatchCall):
    """A call only cut into frames: it never ends."""

    __slots__ = ()

    def ended(self) -> None:
        raise AssertionError("a call only cut into frames does not end")


def _cuts(
    entries: list[tuple[int, bytes]], frame_bytes_max: int = 1 << 20
) -> list[tuple[int, int, int]]:
    requests = [AddRequest(1, entries, KEY, -1)]
    call = _Unsent(requests, 0.0)
    sizes = entry_sizes(requests)[2]
    frames = encode_batches(call, iter(range(1, 1000)).__next__, frame_bytes_max, 1000, sizes)
    return [(frame.opcode, frame.start, frame.stop) for _, _, frame in frames]


def test_a_batch_that_fits_is_one_frame_a_run_or_a_batch() -> None:
    assert _cuts([(i, b"x") for i in range(5, 9)]) == [(f.Opcode.ADD_RUN, 0, 4)]
    assert _cuts([(i, b"x") for i in range(0, 12, 3)]) == [(f.Opcode.ADD_BATCH, 0, 4)]
    assert _cuts([(7, b"x")]) == [(f.Opcode.ADD_ENTRY, 0, 1)]


def test_a_batch_is_cut_at_the_run_limit_the_frame_budget_and_where_ids_go_back() -> None:
    many = [(i, b"x") for i in range(f.RUN_ENTRIES_MAX + 10)]
    assert _cuts(many) == [
        (f.Opcode.ADD_RUN, 0, f.RUN_ENTRIES_MAX),
        (f.Opcode.ADD_RUN, f.RUN_ENTRIES_MAX, f.RUN_ENTRIES_MAX + 10),
    ]
    # three 400-byte entries per frame of 1,500 bytes
    sized = _cuts([(i, b"p" * 400) for i in range(7)], 1500)
    assert [stop - start for _, start, stop in sized] == [3, 3, 1]
    assert _cuts([(1, b"a"), (2, b"b"), (2, b"b"), (3, b"c")]) == [
        (f.Opcode.ADD_RUN, 0, 2),
        (f.Opcode.ADD_RUN, 2, 4),
    ]


def test_an_entry_the_node_refuses_by_itself_goes_alone() -> None:
    entries = [(0, b"a"), (1, b"b" * 2000), (2, b"c"), (3, b"d")]  # entry_bytes_max 1000
    assert _cuts(entries) == [
        (f.Opcode.ADD_ENTRY, 0, 1),
        (f.Opcode.ADD_ENTRY, 1, 2),
        (f.Opcode.ADD_RUN, 2, 4),
    ]


async def test_long_and_strided_batches_are_stored_in_few_frames(data_dir: Path) -> None:
    async with serving(data_dir) as (node, server, address), connect_node(address) as client:
        run = [(i, b"r%d" % i) for i in range(2500)]
        strided = [(i, b"s%d" % i) for i in range(0, 4500, 3)]
        before = server.statistics().requests_by_opcode
        runs_before, batches_before = before["add_run"], before["add_batch"]
        answers = await TcpChannel(client).add_entries_many(
            [AddRequest(1, run, KEY, -1), AddRequest(2, strided, KEY, -1)]
        )
        assert answers == [None, None]  # every entry of each stored
        after = server.statistics().requests_by_opcode
        assert after["add_run"] - runs_before == 3  # 1024 + 1024 + 452
        assert after["add_batch"] - batches_before == 2  # 1024 + 476
        assert await node.read_range(1, 0, 2499, max_entries=5000) == run
        assert await node.read_range(2, 0, 4500, max_entries=5000) == strided


async def test_a_batch_call_ends_at_its_deadline_when_the_node_never_answers() -> None:
    """The node says who it is, takes the frames and never answers them: the call
    raises RequestTimeout at its timeout, swept from its frames in flight."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def answer_info_only(stream: trio.SocketStream) -> None:
        decoder = RequestDecoder()
        while data := await stream.receive_some(65536):
            decoder.receive_data(data)
            for request in decoder.next_requests(1000):
                if isinstance(request, Info):
                    info = InfoResponse(request.request_id, 4, None, 1 << 24, 1 << 20, 0, "t", "i")
                    await stream.send_all(encode_response(info, decoder.version or 4))

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, answer_info_only, listeners)
        async with connect_node(f"127.0.0.1:{port}", timeout_s=5) as client:
            started = trio.current_time()
            with trio.fail_after(5), pytest.raises(pora.RequestTimeout):
                await TcpChannel(client).add_entries_many(
                    [AddRequest(1, [(0, b"x"), (1, b"y")], KEY, -1)], timeout_s=0.2
                )
            # the call's 0.2 s, not the client's 5 s (bounded generously: on a loaded
            # machine the timeout's wake-up can be late)
            assert 0.2 <= trio.current_time() - started < 4.0
        nursery.cancel_scope.cancel()
