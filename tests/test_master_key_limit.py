"""One bound on a ledger's master key, from the wire to the journal: a longer key is
refused with INVALID_ARGUMENT whatever carries it, and no ledger ever takes one."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from net_helpers import raw_connection, receive_responses, serving

import pora
from journal import format as journal_format
from netio import codec
from netio import frames as f
from netio.messages import ErrorResponse, Fence, Info, InfoResponse
from netio.security import MASTER_KEY_BYTES_MAX

_KEY = b"k" * 100


def _frame(opcode: int, request_id: int, body: bytes) -> bytes:
    # built by hand: the codec's encoders refuse such a key before it is sent
    header = f.HEADER.pack(f.LENGTH_MIN + len(body), f.PROTOCOL_VERSION, opcode, 0, 0, request_id)
    return header + body


def test_the_wire_and_the_journal_share_one_bound() -> None:
    assert MASTER_KEY_BYTES_MAX == journal_format.MASTER_KEY_BYTES_MAX == 64
    with pytest.raises(ValueError, match="at most 64"):
        codec.encode_request(Fence(1, 1, _KEY))


async def test_a_100_byte_master_key_is_refused_by_every_operation(data_dir: Path) -> None:
    frames = [
        _frame(f.Opcode.FENCE, 1, f.FENCE_REQUEST.pack(6, len(_KEY)) + _KEY),
        _frame(f.Opcode.CLOSE, 2, f.CLOSE_REQUEST.pack(7, -1, len(_KEY)) + _KEY),
        _frame(f.Opcode.DELETE, 3, f.DELETE_REQUEST.pack(8, len(_KEY)) + _KEY),
        _frame(f.Opcode.READ_ENTRY, 4, f.READ_ENTRY_REQUEST.pack(9, 0, 0, len(_KEY)) + _KEY),
        _frame(
            f.Opcode.ADD_ENTRY,
            5,
            f.ADD_REQUEST_FIXED.pack(10, 0, -1, len(_KEY)) + _KEY + b"payload",
        ),
        _frame(
            f.Opcode.ADD_RUN,
            6,
            f.ADD_RUN_REQUEST_FIXED.pack(11, 0, -1, 2, len(_KEY))
            + _KEY
            + struct.pack(">II", 1, 1)
            + b"ab",
        ),
    ]
    async with serving(data_dir) as (node, _server, address):
        stream = await raw_connection(address)
        await stream.send_all(b"".join(frames) + codec.encode_request(Info(7)))
        responses, closed = await receive_responses(stream, 7)
        assert not closed  # a refusal, not a protocol error: the connection goes on
        by_id = {r.request_id: r for r in responses}
        assert isinstance(by_id[7], InfoResponse)
        for request_id in range(1, 7):
            refusal = by_id[request_id]
            assert isinstance(refusal, ErrorResponse), refusal
            assert refusal.status == f.Status.INVALID_ARGUMENT
            assert "at most 64 bytes" in refusal.message
        # nothing was fenced, closed or keyed with the long key
        assert node.ledgers() == []
        await stream.aclose()


async def test_an_in_process_fence_close_or_delete_refuses_a_100_byte_key(
    data_dir: Path,
) -> None:
    async with pora.open_node(data_dir) as node:
        with pytest.raises(pora.InvalidArgument, match="at most 64 bytes"):
            await node.fence_ledger(1, master_key=_KEY)
        with pytest.raises(pora.InvalidArgument, match="at most 64 bytes"):
            await node.close_ledger(2, master_key=_KEY)
        # nothing was fenced, closed or keyed with the long key
        assert node.ledgers() == []
        await node.add_entry(3, 0, b"kept")
        with pytest.raises(pora.InvalidArgument, match="at most 64 bytes"):
            await node.delete_ledger(3, master_key=_KEY)
        assert await node.read_entry(3, 0) == b"kept"
    async with pora.open_node(data_dir) as node:  # and nothing of it was journalled
        assert [info.ledger_id for info in node.ledgers()] == [3]
