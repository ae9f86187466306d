"""A stream change against a store that times out every write (another process
frozen while it holds SQLite's write lock) gives up with MetadataStalled after its
stall time, instead of retrying forever; once the store answers again, changes go
through."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

import pora
from pora.meta import MetadataConfig, open_metadata
from pora.streams.document import STREAMS_SPACE, StreamConfig, encode_document, new_stream, seal
from pora.streams.records import StreamRecord


@pytest.mark.slow
async def test_a_change_gives_up_on_a_stalled_store(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    config = MetadataConfig(call_timeout_s=0.4)
    async with open_metadata(f"sqlite://{path}", config) as store:
        doc = new_stream("events", StreamConfig(), 0)
        await store.create_document(STREAMS_SPACE, "events", encode_document(doc))
        record = StreamRecord(store, "events", stall_s=1.0)
        other_process = sqlite3.connect(path, isolation_level=None)
        other_process.execute("BEGIN IMMEDIATE")  # frozen while it holds the lock
        started = time.monotonic()
        with pytest.raises(pora.MetadataStalled, match="timed out for 1 s"):
            await record.change(seal)
        assert time.monotonic() - started < 10
        assert not isinstance(pora.MetadataStalled("u", "r", "h"), pora.MetadataTimeout)
        other_process.execute("ROLLBACK")
        other_process.close()
        sealed = await record.change(seal)
        assert sealed.value.state.value == "SEALED"
