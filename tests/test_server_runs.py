"""ADD_RUN over a real loopback socket: a run of adds in one frame, one response."""

from __future__ import annotations

from pathlib import Path

import trio
from net_helpers import raw_connection, receive_responses, serving

from netio import codec
from netio import frames as f
from netio.frames import Opcode, Status
from netio.messages import AddRunResponse, ErrorResponse, Info, InfoResponse, ResponseMessage

KEY = b"k" * 32


async def exchange(
    address: str, *frames: bytes, expect_close: bool = False
) -> tuple[list[ResponseMessage], bool]:
    """Send the frames on a fresh connection; the responses (one per frame) and whether
    the node closed the connection (waited for when `expect_close`)."""
    stream = await raw_connection(address)
    async with stream:
        await stream.send_all(b"".join(frames))
        responses, closed = await receive_responses(stream, len(frames))
        if expect_close and not closed:
            with trio.fail_after(10):
                closed = await stream.receive_some(1) == b""
        return responses, closed


def payloads(first: int, count: int, tag: bytes = b"p") -> list[bytes]:
    return [
        tag + b"-%d" % entry_id * (entry_id % 7 + 1) for entry_id in range(first, first + count)
    ]


async def test_runs_trickling_in_pieces_are_answered_whole(
    data_dir: Path, mock_clock: trio.testing.MockClock
) -> None:
    """A read that ends inside a frame is followed by another read at once (the rest
    usually follows); when the rest is late, the node waits for it, then answers."""
    # jump only after 50 ms of real idleness: the journal's syncs run in threads,
    # which the clock would otherwise not wait for (it would jump to the deadline)
    mock_clock.autojump_threshold = 0.05
    async with serving(data_dir) as (node, _server, address):
        first = codec.encode_add_run(1, 5, 0, [b"a" * 1000] * 64, master_key=KEY)
        second = codec.encode_add_run(2, 5, 64, [b"b" * 1000] * 64, master_key=KEY)
        stream = await raw_connection(address)
        async with stream:
            # the first frame in three pieces with pauses, the last with the second
            # frame's first bytes; then the rest of the second
            await stream.send_all(first[:10])
            await trio.sleep(0.05)
            await stream.send_all(first[10:40_000])
            await trio.sleep(0.05)
            await stream.send_all(first[40_000:] + second[:100])
            await trio.sleep(0.05)
            await stream.send_all(second[100:])
            responses, closed = await receive_responses(stream, 2)
        assert not closed
        assert sorted(responses, key=lambda r: r.request_id) == [
            AddRunResponse(1, 5, 0, 64, []),
            AddRunResponse(2, 5, 64, 64, []),
        ]
        stored = await node.read_range(5, 0, 127, max_entries=200)
        assert [payload for _, payload in stored] == [b"a" * 1000] * 64 + [b"b" * 1000] * 64


async def test_a_run_is_stored_with_one_journal_record_and_one_response(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        seq_before = node.statistics().journal.next_seq
        (response,), closed = await exchange(
            address,
            codec.encode_add_run(41, 3, 0, payloads(0, 300), master_key=KEY, last_add_confirmed=-1),
        )
        assert not closed
        assert response == AddRunResponse(41, 3, 0, 300, [])
        # the whole run is one journal record, one sequence number (besides the KEY
        # record that fixes a new ledger's key)
        assert node.statistics().journal.next_seq - seq_before == 2
        stored = await node.read_range(3, 0, 299, max_entries=1000)
        assert stored == list(zip(range(300), payloads(0, 300), strict=True))
        # the piggybacked LAC of a run is kept as for single adds
        (response,), _ = await exchange(
            address,
            codec.encode_add_run(42, 3, 300, [b"x"], master_key=KEY, last_add_confirmed=299),
        )
        assert response == AddRunResponse(42, 3, 300, 1, [])
        assert node.last_add_confirmed(3) == 299


async def test_a_retried_run_is_ok_and_entries_stored_with_other_bytes_fail_alone(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        first = codec.encode_add_run(1, 8, 10, payloads(10, 5), master_key=KEY)
        responses, _ = await exchange(address, first)
        assert responses == [AddRunResponse(1, 8, 10, 5, [])]
        # the same run again (a retry after a lost connection) is OK
        responses, _ = await exchange(
            address, codec.encode_add_run(2, 8, 10, payloads(10, 5), master_key=KEY)
        )
        assert responses == [AddRunResponse(2, 8, 10, 5, [])]
        # a run over entries 12..17 where 12 and 14 are stored with other bytes
        overlapping = payloads(12, 6, b"new")
        overlapping[1] = payloads(13, 1)[0]  # entry 13: the same bytes, a retry
        (response,), closed = await exchange(
            address, codec.encode_add_run(3, 8, 12, overlapping, master_key=KEY)
        )
        assert not closed
        assert isinstance(response, AddRunResponse)
        assert (response.first_entry_id, response.count) == (12, 6)
        assert [(entry_id, status) for entry_id, status, _ in response.failures] == [
            (12, Status.ENTRY_CONFLICT),
            (14, Status.ENTRY_CONFLICT),
        ]
        assert (
            "entry 12 of ledger 8 is already stored with different bytes" in response.failures[0][2]
        )
        stored = dict(await node.read_range(8, 10, 17))
        assert stored[12] == payloads(12, 1)[0] and stored[14] == payloads(14, 1)[0]
        assert [stored[e] for e in (15, 16, 17)] == overlapping[3:]


async def test_whole_run_refusals_name_the_cause_and_store_nothing(data_dir: Path) -> None:
    async with serving(data_dir, node_options={"entry_bytes_max": 1024}) as (node, _s, address):
        await node.add_entry(5, 0, b"first", master_key=KEY)
        big = [b"a", b"b" * 1025, b"c"]
        responses, closed = await exchange(
            address,
            codec.encode_add_run(1, 5, 1, [b"x", b"y"], master_key=b"wrong"),
            codec.encode_add_run(2, 5, 1, big, master_key=KEY),
            codec.encode_add_run(3, 5, 2**63 - 2, [b"x", b"y", b"z"], master_key=KEY),
            codec.encode_add_run(4, -1, 0, [b"x"], master_key=KEY),
            codec.encode_request(Info(5)),
        )
        assert not closed  # refusals are answers: the connection serves on
        by_id = {response.request_id: response for response in responses}
        unauthorized, too_large, overflow, negative = (by_id[i] for i in (1, 2, 3, 4))
        assert isinstance(unauthorized, ErrorResponse)
        assert (unauthorized.opcode, unauthorized.status) == (Opcode.ADD_RUN, Status.UNAUTHORIZED)
        assert isinstance(too_large, ErrorResponse)
        assert too_large.status == Status.TOO_LARGE
        assert (too_large.ledger_id, too_large.entry_id) == (5, 2)
        assert "entry 2 of 1025 bytes" in too_large.message
        assert isinstance(overflow, ErrorResponse)
        assert overflow.status == Status.INVALID_ARGUMENT
        assert "passes the largest entry id" in overflow.message
        assert isinstance(negative, ErrorResponse)
        assert negative.status == Status.INVALID_ARGUMENT
        assert isinstance(by_id[5], InfoResponse)
        assert await node.read_range(5, 0, 10) == [(0, b"first")]


async def test_closed_and_fenced_ledgers_refuse_runs_but_recovery_runs_pass(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(6, 0, b"zero", master_key=KEY)
        await node.fence_ledger(6, master_key=KEY)
        responses, _ = await exchange(
            address,
            codec.encode_add_run(1, 6, 1, [b"plain"], master_key=KEY),
        )
        assert isinstance(responses[0], ErrorResponse)
        assert responses[0].status == Status.FENCED
        responses, _ = await exchange(
            address,
            codec.encode_add_run(2, 6, 1, [b"one", b"two"], master_key=KEY, recovery=True),
        )
        assert responses == [AddRunResponse(2, 6, 1, 2, [])]
        await node.close_ledger(6, master_key=KEY)
        responses, _ = await exchange(
            address,
            codec.encode_add_run(3, 6, 3, [b"late"], master_key=KEY, recovery=True),
        )
        assert isinstance(responses[0], ErrorResponse)
        assert responses[0].status == Status.CLOSED
        assert await node.read_range(6, 0, 10) == [(0, b"zero"), (1, b"one"), (2, b"two")]


async def test_a_malformed_run_closes_its_connection_only(data_dir: Path) -> None:
    async with serving(data_dir) as (node, server, address):
        good = codec.encode_add_run(1, 2, 0, [b"a", b"b"])
        bad = bytearray(codec.encode_add_run(2, 2, 2, [b"c", b"d"]))
        bad[f.ADD_RUN_REQUEST.size + 3] += 1  # the first size says one byte more than sent
        version_1 = bytearray(codec.encode_add_run(3, 2, 2, [b"c"]))
        version_1[4] = 1
        healthy = await raw_connection(address)
        async with healthy:
            responses, closed = await exchange(address, good, bytes(bad), expect_close=True)
            assert closed
            by_id = {response.request_id: response for response in responses}
            assert by_id[1] == AddRunResponse(1, 2, 0, 2, [])  # the good frame before it
            assert isinstance(by_id[2], ErrorResponse)
            assert by_id[2].status == Status.BAD_REQUEST
            assert "payload sizes add up to 3 bytes, but 2 bytes" in by_id[2].message
            responses, closed = await exchange(address, bytes(version_1), expect_close=True)
            assert closed
            assert isinstance(responses[0], ErrorResponse)
            assert "this node speaks versions 2, 3 and 4" in responses[0].message
            # another connection was never disturbed
            await healthy.send_all(codec.encode_add_run(4, 2, 2, [b"c"]))
            (response,), closed = await receive_responses(healthy, 1)
            assert response == AddRunResponse(4, 2, 2, 1, [])
        assert server.statistics().protocol_errors == 2
        # malformed frames never became requests: only the two good runs count
        assert server.statistics().requests_by_opcode["add_run"] == 2
        assert await node.read_range(2, 0, 10) == [(0, b"a"), (1, b"b"), (2, b"c")]


async def test_runs_and_single_adds_pipelined_on_one_connection(data_dir: Path) -> None:
    """Thousands of runs and single adds in flight on one connection, to several
    ledgers: every request gets its own answer and every entry reads back."""
    async with serving(data_dir) as (node, _server, address):
        frames: list[bytes] = []
        expected: dict[int, object] = {}
        request_id = 0
        next_entry = {10: 0, 11: 0}
        for round_index in range(400):
            ledger_id = 10 + round_index % 2
            first = next_entry[ledger_id]
            count = 1 + round_index % 9
            request_id += 1
            frames.append(
                codec.encode_add_run(request_id, ledger_id, first, payloads(first, count))
            )
            expected[request_id] = AddRunResponse(request_id, ledger_id, first, count, [])
            for entry_id in range(first + count, first + count + 3):
                request_id += 1
                frames.append(
                    codec.encode_add_entry(
                        request_id, ledger_id, entry_id, payloads(entry_id, 1)[0]
                    )
                )
                expected[request_id] = ("add", ledger_id, entry_id)
            next_entry[ledger_id] = first + count + 3
        stream = await raw_connection(address)
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, b"".join(frames))
            responses, closed = await receive_responses(stream, len(frames), timeout_s=60)
        assert not closed
        assert len(responses) == len(frames)
        for response in responses:
            want = expected.pop(response.request_id)
            if isinstance(want, AddRunResponse):
                assert response == want
            else:
                assert (type(response).__name__, response.ledger_id, response.entry_id) == (  # type: ignore[union-attr]
                    "AddEntryResponse",
                    want[1],  # type: ignore[index]
                    want[2],  # type: ignore[index]
                )
        assert not expected
        for ledger_id, end in next_entry.items():
            stored = await node.read_range(ledger_id, 0, end, max_entries=10_000)
            assert stored == list(zip(range(end), payloads(0, end), strict=True))
