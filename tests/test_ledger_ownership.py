"""Only a ledger's owner deletes it; a closed ledger takes no adds, and journals none.

Over the wire: DELETE carries the ledger's key from protocol version 3 on; a node
still serves version-2 connections for every other operation and refuses their
DELETE by name.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import trio
from net_helpers import raw_connection, receive_responses, serving

import pora
from netio import codec
from netio import frames as f
from netio.messages import (
    AddEntryResponse,
    Delete,
    ErrorResponse,
    Info,
    InfoResponse,
    ReadEntry,
    ReadEntryResponse,
)
from pora.client.node_client import connect_node


async def test_delete_without_the_ledgers_key_is_refused_and_changes_nothing(
    data_dir: Path,
) -> None:
    async with pora.open_node(data_dir) as node:
        for entry_id in range(3):
            await node.add_entry(4, entry_id, b"mine %d" % entry_id, master_key=b"owner")
        for key in (b"", b"thief"):
            with pytest.raises(pora.Unauthorized, match="wrong master key for ledger 4"):
                await node.delete_ledger(4, master_key=key)
        assert [await node.read_entry(4, i) for i in range(3)] == [b"mine 0", b"mine 1", b"mine 2"]
        # nor can the thief re-create it under its own key and shut the owner out
        with pytest.raises(pora.Unauthorized):
            await node.add_entry(4, 0, b"theirs", master_key=b"thief")
        await node.add_entry(4, 3, b"mine 3", master_key=b"owner")
        await node.delete_ledger(4, master_key=b"owner")
        with pytest.raises(pora.NoSuchLedger):
            await node.read_entry(4, 0)


async def test_the_client_deletes_with_the_ledgers_password(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address), connect_node(address) as client:
        await client.add_entry(6, 0, b"a", password="pw")
        with pytest.raises(pora.Unauthorized):
            await client.delete_ledger(6)
        with pytest.raises(pora.Unauthorized):
            await client.delete_ledger(6, password="other")
        assert await client.read_entry(6, 0) == b"a"
        await client.delete_ledger(6, password="pw")
        assert [s.ledger_id for s in await client.list_ledgers()] == []
        assert node.statistics().ledgers.ledgers == 0


def _as_version(frame: bytes, version: int) -> bytes:
    """A frame of this version's layout with another version in its header (the
    layouts of every operation but DELETE are the same in versions 2 and 3)."""
    return frame[:4] + bytes([version]) + frame[5:]


async def test_a_version_2_connection_is_served_but_its_delete_is_refused(
    data_dir: Path,
) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(7, 0, b"kept")
        stream = await raw_connection(address)
        old_delete = f.HEADER.pack(f.LENGTH_MIN + 8, 2, f.Opcode.DELETE, 0, 0, 2) + struct.pack(
            ">q", 7
        )
        await stream.send_all(
            _as_version(codec.encode_request(Info(1)), 2)
            + old_delete
            + _as_version(codec.encode_request(ReadEntry(3, 7, 0)), 2)
            + _as_version(codec.encode_add_entry(4, 7, 1, b"more"), 2)
        )
        decoder = codec.ResponseDecoder(version=2)  # answers come in version 2
        responses: list[object] = []
        with trio.fail_after(10):
            while len(responses) < 4:
                data = await stream.receive_some(65536)
                assert data, "the node closed a version-2 connection"
                decoder.receive_data(bytes(data))
                responses.extend(decoder.next_responses())
        by_id = {r.request_id: r for r in responses}  # type: ignore[attr-defined]
        assert isinstance(by_id[1], InfoResponse)
        assert by_id[1].protocol_version == f.PROTOCOL_VERSION
        refusal = by_id[2]
        assert isinstance(refusal, ErrorResponse)
        assert refusal.status == f.Status.BAD_REQUEST
        assert "protocol version 2 carries no master key" in refusal.message
        assert isinstance(by_id[3], ReadEntryResponse) and by_id[3].payload == b"kept"
        assert isinstance(by_id[4], AddEntryResponse)
        assert await node.read_entry(7, 1) == b"more"
        await stream.aclose()


async def test_a_version_3_delete_frame_carries_the_key(data_dir: Path) -> None:
    async with serving(data_dir) as (node, _server, address):
        await node.add_entry(8, 0, b"x", master_key=b"k")
        stream = await raw_connection(address)
        await stream.send_all(
            codec.encode_request(Delete(1, 8, b"wrong")) + codec.encode_request(Delete(2, 8, b"k"))
        )
        responses, closed = await receive_responses(stream, 2)
        assert not closed
        by_id = {r.request_id: r for r in responses}
        assert isinstance(by_id[1], ErrorResponse)
        assert by_id[1].status == f.Status.UNAUTHORIZED
        assert not isinstance(by_id[2], ErrorResponse)
        assert node.statistics().ledgers.ledgers == 0
        await stream.aclose()


async def test_an_add_to_a_closed_ledger_is_not_journalled(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(9, 0, b"a", master_key=b"k")
        await node.close_ledger(9, master_key=b"k")
        records = node.statistics().journal.operations
        journal_bytes = node.statistics().journal.bytes_written
        for entry_id in range(1, 50):
            with pytest.raises(pora.LedgerClosed, match="ledger 9 is closed"):
                await node.add_entry(9, entry_id, b"late" * 100, master_key=b"k")
        outcomes = await node.add_entries([(9, 50, b"x"), (9, 51, b"y")], master_key=b"k")
        assert all(isinstance(outcome, pora.LedgerClosed) for outcome in outcomes)
        assert node.statistics().journal.operations == records
        assert node.statistics().journal.bytes_written == journal_bytes
