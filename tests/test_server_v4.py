"""Version 4's operations over a real loopback socket, and what the node does with
them: batches, LAC reads that fence and long-poll, WRITE_LAC, ranges that say MORE,
CORRUPT on every read path."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from net_helpers import raw_connection, receive_responses, serving
from waiting import wait_until

import pora
from netio import codec
from netio import frames as f
from netio.messages import (
    AddBatch,
    AddBatchResponse,
    ErrorResponse,
    Info,
    InfoResponse,
    LacResponse,
    ReadEntry,
    ReadLac,
    ReadRange,
    ReadRangeResponse,
    RequestMessage,
    ResponseMessage,
    WriteLac,
    WriteLacResponse,
)

KEY = b"k" * 32


async def ask(address: str, *messages: RequestMessage) -> list[ResponseMessage]:
    """Send the requests on a fresh version-4 connection; their responses, by id."""
    stream = await raw_connection(address)
    async with stream:
        await stream.send_all(b"".join(codec.encode_request(m) for m in messages))
        responses, closed = await receive_responses(stream, len(messages))
    assert not closed
    return sorted(responses, key=lambda r: r.request_id)


async def test_info_names_the_data_dirs_instance(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address):
        [info] = await ask(address, Info(1))
        assert isinstance(info, InfoResponse)
        assert info.protocol_version == 4
        assert info.instance_id == node.data_dir.instance_id != ""


async def test_a_batch_stores_sparse_ids_and_lists_its_conflicts(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(7, 6, b"other", master_key=KEY)
        ids = [0, 3, 4, 6, 9]
        [response] = await ask(address, AddBatch(1, 7, 2, KEY, ids, [b"e%d" % i for i in ids]))
        assert isinstance(response, AddBatchResponse)
        assert (response.ledger_id, response.first_entry_id, response.count) == (7, 0, 5)
        assert [(e, s) for e, s, _ in response.failures] == [(6, f.Status.ENTRY_CONFLICT)]
        stored = await node.read_range(7, 0, 10)
        assert stored == [(0, b"e0"), (3, b"e3"), (4, b"e4"), (6, b"other"), (9, b"e9")]
        assert node.last_add_confirmed(7) == 2


async def test_a_batch_refused_by_the_ledger_is_an_error_and_stores_nothing(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.fence_ledger(7, master_key=KEY)
        plain, recovery, wrong_key = await ask(
            address,
            AddBatch(1, 7, -1, KEY, [0, 2], [b"a", b"b"]),
            AddBatch(2, 7, -1, KEY, [0, 2], [b"a", b"b"], recovery=True),
            AddBatch(3, 7, -1, b"x" * 32, [5], [b"c"], recovery=True),
        )
        assert isinstance(plain, ErrorResponse) and plain.status == f.Status.FENCED
        assert isinstance(recovery, AddBatchResponse) and recovery.failures == []
        assert isinstance(wrong_key, ErrorResponse)
        assert wrong_key.status == f.Status.UNAUTHORIZED
        assert await node.read_range(7, 0, 10) == [(0, b"a"), (2, b"b")]


async def test_a_batch_with_ids_out_of_order_is_refused_and_the_connection_stays(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (_node, _server, address):
        items = f.BATCH_ITEM.pack(4, 1) + f.BATCH_ITEM.pack(2, 1)
        body = f.ADD_BATCH_REQUEST_FIXED.pack(7, -1, 2, 0) + items + b"ab"
        frame = f.HEADER.pack(f.LENGTH_MIN + len(body), 4, f.Opcode.ADD_BATCH, 0, 0, 1) + body
        stream = await raw_connection(address)
        async with stream:
            await stream.send_all(frame + codec.encode_request(Info(2)))
            responses, closed = await receive_responses(stream, 2)
        assert not closed
        refused, info = sorted(responses, key=lambda r: r.request_id)
        assert isinstance(refused, ErrorResponse)
        assert refused.status == f.Status.INVALID_ARGUMENT
        assert isinstance(info, InfoResponse)


async def test_read_lac_answers_the_last_entry_stored(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entries([(7, 0, b"a"), (7, 1, b"b")], master_key=KEY)
        await node.add_entry(7, 2, b"c", master_key=KEY, last_add_confirmed=1)
        [lac] = await ask(address, ReadLac(1, 7))
        assert lac == LacResponse(1, 7, 1, 2)


async def test_a_fencing_read_lac_creates_an_unknown_ledger_fenced(data_dir: Path) -> None:
    """A recovery must fence nodes that never received an entry of the ledger."""
    async with serving(data_dir) as (node, _server, address):
        # (one at a time: requests on a connection run concurrently)
        [lac] = await ask(address, ReadLac(1, 70, fence=True, master_key=KEY))
        [refused] = await ask(address, AddBatch(2, 70, -1, KEY, [0], [b"late"]))
        assert lac == LacResponse(1, 70, -1, -1)
        assert node.ledger_info(70).state == "fenced"
        assert isinstance(refused, ErrorResponse) and refused.status == f.Status.FENCED


async def test_a_fencing_read_lac_with_another_key_is_unauthorized(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(7, 0, b"a", master_key=KEY)
        [refused] = await ask(address, ReadLac(1, 7, fence=True, master_key=b"x" * 32))
        assert isinstance(refused, ErrorResponse) and refused.status == f.Status.UNAUTHORIZED
        assert node.ledger_info(7).state == "open"


async def _long_poll_lac(address: str, request: ReadLac) -> ResponseMessage:
    [response] = await ask(address, request)
    return response


@pytest.mark.parametrize("wake_by", ["add", "write_lac", "fence", "close"])
async def test_a_lac_long_poll_is_answered_when_the_lac_moves_or_the_ledger_ends(
    data_dir: Path, wake_by: str
) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(7, 0, b"a", master_key=KEY)
        result: list[ResponseMessage] = []
        answered = trio.Event()

        async def poll() -> None:
            result.append(await _long_poll_lac(address, ReadLac(1, 7, -1, 30_000)))
            answered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await wait_until(lambda: node.statistics().long_polls.long_polls_waiting > 0, 5)
            assert not result
            if wake_by == "add":
                await node.add_entry(7, 1, b"b", master_key=KEY, last_add_confirmed=0)
            elif wake_by == "write_lac":
                [ok] = await ask(address, WriteLac(2, 7, 0, KEY))
                assert ok == WriteLacResponse(2, 7, 0)
            elif wake_by == "fence":
                await node.fence_ledger(7, master_key=KEY)
            else:
                await node.close_ledger(7, master_key=KEY)
            with trio.fail_after(5):
                await answered.wait()
        [answer] = result
        assert isinstance(answer, LacResponse)
        expected_lac = 0 if wake_by in ("add", "write_lac") else -1
        assert answer.last_add_confirmed == expected_lac


async def test_a_lac_long_poll_that_times_out_answers_ok_with_the_current_values(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(7, 0, b"a", master_key=KEY, last_add_confirmed=-1)
        with trio.fail_after(5):
            [answer] = await ask(address, ReadLac(1, 7, -1, 50))
        assert answer == LacResponse(1, 7, -1, 0)


async def test_a_lac_read_with_entry_answers_the_entry_after_known_lac_when_held(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entries([(7, 0, b"a"), (7, 1, b"b"), (7, 3, b"d")], master_key=KEY)
        await node.add_entry(7, 4, b"e", master_key=KEY, last_add_confirmed=3)
        held, absent, beyond = await ask(
            address,
            ReadLac(1, 7, 0, with_entry=True),  # entry 1: held
            ReadLac(2, 7, 1, with_entry=True),  # entry 2: not on this node
            ReadLac(3, 7, 4, with_entry=True),  # entry 5: past the last stored
        )
        assert held == LacResponse(1, 7, 3, 4, b"b")
        assert absent == LacResponse(2, 7, 3, 4, None)
        assert beyond == LacResponse(3, 7, 3, 4, None)


async def test_a_lac_long_poll_with_entry_brings_the_entry_the_lac_confirms(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(7, 0, b"a", master_key=KEY)
        result: list[ResponseMessage] = []

        async def poll() -> None:
            result.extend(await ask(address, ReadLac(1, 7, -1, 30_000, with_entry=True)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await wait_until(lambda: node.statistics().long_polls.long_polls_waiting > 0, 5)
            await node.add_entry(7, 1, b"b", master_key=KEY, last_add_confirmed=0)
        assert result == [LacResponse(1, 7, 0, 1, b"a")]


async def test_a_lac_long_poll_is_answered_shutting_down_at_shutdown(data_dir: Path) -> None:
    async with serving(data_dir) as (node, server, address):
        await node.add_entry(7, 0, b"a", master_key=KEY)
        stream = await raw_connection(address)
        async with stream:
            await stream.send_all(codec.encode_request(ReadLac(1, 7, 5, 60_000)))
            await wait_until(lambda: node.statistics().long_polls.long_polls_waiting > 0, 5)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(server.shutdown, 5.0)
                responses, _closed = await receive_responses(stream, 1)
        [answer] = responses
        assert isinstance(answer, ErrorResponse)
        assert answer.status == f.Status.SHUTTING_DOWN


async def test_write_lac_keeps_the_highest_and_refuses_fenced_closed_and_strangers(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(7, 0, b"a", master_key=KEY)
        await node.add_entry(8, 0, b"a", master_key=KEY)
        await node.add_entry(9, 0, b"a", master_key=KEY)
        await node.fence_ledger(8, master_key=KEY)
        await node.close_ledger(9, master_key=KEY)
        # (one at a time: requests on a connection run concurrently)
        assert await ask(address, WriteLac(1, 7, 5, KEY)) == [WriteLacResponse(1, 7, 5)]
        assert await ask(address, WriteLac(2, 7, 3, KEY)) == [WriteLacResponse(2, 7, 5)]
        answers = await ask(
            address,
            WriteLac(3, 7, 9, b"x" * 32),
            WriteLac(4, 8, 0, KEY),
            WriteLac(5, 9, 0, KEY),
            WriteLac(6, 99, 0, KEY),
        )
        statuses = [a.status for a in answers if isinstance(a, ErrorResponse)]
        assert statuses == [
            f.Status.UNAUTHORIZED,
            f.Status.FENCED,
            f.Status.CLOSED,
            f.Status.NO_SUCH_LEDGER,
        ]
        assert node.last_add_confirmed(7) == 5


async def test_a_capped_range_says_more_and_a_complete_one_does_not(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address):
        ids = list(range(0, 30, 3))  # a node of a striped ensemble holds every third
        await node.add_batch(7, ids, [b"p%d" % i for i in ids], master_key=KEY)
        await node._registry.flush_all()  # half on disk, half in the memtable
        await node.add_batch(7, [30, 33], [b"p30", b"p33"], master_key=KEY)
        capped, whole, by_bytes = await ask(
            address,
            ReadRange(1, 7, 0, 40, 4, 1 << 20),
            ReadRange(2, 7, 0, 40, 100, 1 << 20),
            ReadRange(3, 7, 20, 40, 100, 5),
        )
        assert isinstance(capped, ReadRangeResponse) and capped.more
        assert [e for e, _ in capped.entries] == [0, 3, 6, 9]
        assert isinstance(whole, ReadRangeResponse) and not whole.more
        assert [e for e, _ in whole.entries] == [*ids, 30, 33]
        assert isinstance(by_bytes, ReadRangeResponse) and by_bytes.more
        assert [e for e, _ in by_bytes.entries] == [21]


async def test_a_fencing_range_read_fences_first(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(7, 0, b"a", master_key=KEY)
        [answer] = await ask(address, ReadRange(1, 7, 0, 5, 10, 100, True, KEY))
        assert isinstance(answer, ReadRangeResponse) and answer.entries == [(0, b"a")]
        assert node.ledger_info(7).state == "fenced"


MARKER = b"0123456789abcdef" * 8


async def test_a_corrupt_entry_is_corrupt_on_every_read_path(data_dir: Path) -> None:
    """Never "no such entry": recovery would take that for proof of absence."""
    async with pora.open_node(data_dir) as node:
        for entry_id in range(3):
            await node.add_entry(11, entry_id, MARKER + bytes([entry_id]), master_key=KEY)
        await node._registry.flush_all()
        log_path = node._registry.storage.entrylog_path(11)
    data = bytearray(log_path.read_bytes())
    data[data.index(MARKER + b"\x01") + 5] ^= 0xFF
    log_path.write_bytes(bytes(data))
    async with serving(data_dir) as (_node, _server, address):
        answers = await ask(
            address,
            ReadEntry(1, 11, 1),
            ReadEntry(2, 11, 1, wait_ms=1000),
            ReadEntry(3, 11, 1, fence=True, master_key=KEY),
            ReadRange(4, 11, 0, 2, 10, 1 << 20),
            ReadRange(5, 11, 1, 1, 10, 1 << 20),
        )
        for answer in answers:
            assert isinstance(answer, ErrorResponse), answer
            assert answer.status == f.Status.CORRUPT, answer
