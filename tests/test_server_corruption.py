"""A read that meets damaged data: the client learns it is corruption, and the
operator finds one log line saying which ledger, entry, file and offset."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from net_helpers import serving

import pora
from pora.client.node_client import connect_node

MARKER = b"0123456789abcdef" * 8


async def test_a_corrupt_entry_is_answered_corrupt_and_logged_once(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with pora.open_node(data_dir) as node:
        for entry_id in range(3):
            await node.add_entry(11, entry_id, MARKER + bytes([entry_id]))
        await node._registry.flush_all()
        log_path = node._registry.storage.entrylog_path(11)
    data = bytearray(log_path.read_bytes())
    at = data.index(MARKER + b"\x01")
    data[at + 5] ^= 0xFF
    log_path.write_bytes(bytes(data))
    async with serving(data_dir) as (_node, _server, address), connect_node(address) as client:
        with (
            caplog.at_level(logging.ERROR, logger="pora.server"),
            pytest.raises(pora.StorageCorruption) as caught,
        ):
            await client.read_entry(11, 1)
        assert str(log_path) in str(caught.value)
        lines = [r.getMessage() for r in caplog.records if "corrupt" in r.getMessage()]
        assert len(lines) == 1
        assert "ledger 11 entry 1" in lines[0]
        assert str(log_path) in lines[0] and "offset" in lines[0]
        assert await client.read_entry(11, 0) == MARKER + b"\x00"  # the rest is served
