"""R14: a close whose write of the record failed (a timeout, the store unreachable)
leaves the writer closing, not closed: the error reaches the caller, appends are
refused, and `close()` again retries, finding a timed-out write that took."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import trio
from replicated_ledger_support import PASSWORD
from replication_support import local_cluster
from writer_support import client_on

from ledger.errors import LedgerClosed, LedgerFenced
from pora.client.replication.core.ledger_records import in_recovery
from pora.meta.config import MetadataConfig
from pora.meta.errors import MetadataTimeout
from pora.meta.records import LedgerMetadata, LedgerState, Versioned

#: a close that loops on a locked store instead of failing is cut off here
CLOSE_PATIENCE_S = 20.0


async def test_a_close_that_timed_out_on_a_locked_store_is_retried(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster, metadata=MetadataConfig(call_timeout_s=0.5)) as client,
    ):
        ledger = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        payloads = [b"entry %d" % k for k in range(10)]
        assert await ledger.append_many(payloads) == list(range(10))
        locker = sqlite3.connect(tmp_path / "meta.db", isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")  # every write of the store waits, then fails
            with trio.fail_after(CLOSE_PATIENCE_S), pytest.raises(MetadataTimeout):
                await ledger.close()
            with pytest.raises(LedgerClosed):  # closing: no more appends
                await ledger.append(b"late")
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert (await cluster.store.read_ledger(ledger.ledger_id)).value.state is (LedgerState.OPEN)
        with trio.fail_after(CLOSE_PATIENCE_S):
            await ledger.close()
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert (record.state, record.last_entry_id) == (LedgerState.CLOSED, 9)
        assert record.length == sum(len(p) for p in payloads)
        reader = await client.open_ledger(ledger.ledger_id, password=PASSWORD)
        assert [p async for _, p in reader.read_entries(0, 9)] == payloads
        await ledger.close()  # closed: returns


async def test_a_timed_out_close_that_took_is_found_closed_on_retry(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await ledger.append_many([b"a", b"bc"])
        store = client.store
        real_update = store.update_ledger
        updates: list[LedgerMetadata] = []

        async def took_then_timed_out(
            meta: LedgerMetadata, expected_version: int
        ) -> Versioned[LedgerMetadata]:
            updates.append(meta)
            await real_update(meta, expected_version)
            raise MetadataTimeout(store.url, "no answer (test)", "none")

        store.update_ledger = took_then_timed_out  # type: ignore[method-assign]
        with pytest.raises(MetadataTimeout):
            await ledger.close()
        store.update_ledger = real_update  # type: ignore[method-assign]
        await ledger.close()  # the re-read finds it CLOSED at this writer's LAC
        assert len(updates) == 1
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert (record.state, record.last_entry_id, record.length) == (LedgerState.CLOSED, 1, 3)


async def test_a_close_retried_after_a_recovery_took_the_ledger_is_fenced(
    tmp_path: Path,
) -> None:
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await ledger.append(b"a")
        store = client.store
        real_update = store.update_ledger

        async def unreachable(
            meta: LedgerMetadata, expected_version: int
        ) -> Versioned[LedgerMetadata]:
            raise MetadataTimeout(store.url, "no answer (test)", "none")

        store.update_ledger = unreachable  # type: ignore[method-assign]
        with trio.fail_after(CLOSE_PATIENCE_S), pytest.raises(MetadataTimeout):
            await ledger.close()
        store.update_ledger = real_update  # type: ignore[method-assign]
        current = await cluster.store.read_ledger(ledger.ledger_id)
        await cluster.store.update_ledger(in_recovery(current.value), current.version)
        with pytest.raises(LedgerFenced):  # R11: the record is the recovery's
            await ledger.close()
        assert (await cluster.store.read_ledger(ledger.ledger_id)).value.state is (
            LedgerState.IN_RECOVERY
        )
        await ledger.close()  # closed (fenced): returns
