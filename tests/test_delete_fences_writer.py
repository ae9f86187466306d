"""R26: a delete fences the ledger's writer before it deletes the record, and the
nodes refuse the deleted ledger for good, on an in-process cluster (real nodes,
real files, a real SQLite store)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from replication_support import local_cluster
from waiting import wait_until
from writer_support import client_on

import pora
import pora.client.replication.client as client_module
from netio.security import master_key_from_password
from pora.client.replication.recovery import Recovery
from pora.meta.errors import NoSuchLedgerMetadata
from pora.meta.records import LedgerState


@pytest.mark.parametrize(("e", "qw", "qa"), [(3, 3, 2), (3, 2, 2)])
async def test_a_delete_stops_its_writer_and_its_tail(
    tmp_path: Path, e: int, qw: int, qa: int
) -> None:
    async with (
        local_cluster(tmp_path, nodes=4) as cluster,
        client_on(cluster) as writing,
        client_on(cluster) as other,
    ):
        ledger = await writing.create_ledger(e, qw, qa, password="pw")
        ledger_id = ledger.ledger_id
        acknowledged: list[int] = []
        late: list[int] = []  # acknowledged after the delete returned
        failures: list[BaseException] = []
        delete_returned = False
        tail_ended: list[BaseException] = []
        tailed: list[int] = []

        async def append_forever(task: int) -> None:
            k = 0
            while True:
                try:
                    entry_id = await ledger.append(b"task %d entry %d" % (task, k))
                except pora.PoraError as error:
                    failures.append(error)
                    return
                (late if delete_returned else acknowledged).append(entry_id)
                k += 1

        async def follow() -> None:
            reader = await other.open_ledger(ledger_id, password="pw", recover=False)
            try:
                async for entry_id, _payload in reader.tail():
                    tailed.append(entry_id)
            except BaseException as error:  # the test asserts on its type
                tail_ended.append(error)
                return
            tail_ended.append(AssertionError("the tail ended without an error"))

        async with trio.open_nursery() as nursery:
            for task in range(20):
                nursery.start_soon(append_forever, task)
            nursery.start_soon(follow)
            await wait_until(lambda: len(acknowledged) >= 200 and len(tailed) >= 20, 60)
            await other.delete_ledger(ledger_id, password="pw")
            delete_returned = True
            # every appending task ends with the typed error; the tail ends too
            await wait_until(lambda: len(failures) == 20 and len(tail_ended) == 1, 60)
            with pytest.raises(pora.LedgerDeleted):  # a later append
                await ledger.append(b"after the delete")
            with pytest.raises(pora.LedgerDeleted):
                await ledger.close()

        assert late == []
        assert all(isinstance(error, pora.LedgerDeleted) for error in failures), failures
        assert isinstance(failures[0], pora.LedgerFenced)  # what a writer already catches
        assert isinstance(tail_ended[0], pora.NoSuchLedger), repr(tail_ended[0])
        with pytest.raises(NoSuchLedgerMetadata):
            await cluster.store.read_ledger(ledger_id)
        with pytest.raises(pora.NoSuchLedger):
            await other.open_ledger(ledger_id, password="pw")
        key = master_key_from_password("pw")
        for node in cluster.nodes.values():
            assert ledger_id not in [info.ledger_id for info in node.ledgers()]
            with pytest.raises(pora.NoSuchLedger):
                await node.read_entry(ledger_id, 0)
        for address in {m.address for m in ledger.metadata.ensembles[-1].members}:
            # a node of the ensemble refuses a late add (ids are never reused)
            with pytest.raises(pora.LedgerDeleted):
                await cluster.nodes[address].add_entry(ledger_id, 10**6, b"late", master_key=key)


async def test_a_reader_of_a_deleted_ledger_gets_no_such_ledger(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(3, 3, 2, password="pw")
        await ledger.append_many([b"a", b"b", b"c"])
        await ledger.append(b"d")  # carries LAC 2 to the nodes
        reader = await client.open_ledger(ledger.ledger_id, password="pw", recover=False)
        assert await reader.read(0) == b"a"
        await client.delete_ledger(ledger.ledger_id, password="pw")
        with pytest.raises(pora.NoSuchLedger):
            await reader.read(1)
        with pytest.raises(pora.NoSuchLedger):
            async for _ in reader.tail(4):
                pass
        with pytest.raises(pora.LedgerDeleted):
            await ledger.append(b"e")


async def test_a_delete_that_cannot_fence_keeps_the_record_marked_and_a_retry_finishes(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(3, 3, 2, password="pw")
        await ledger.append(b"a")
        members = [m.address for m in ledger.metadata.ensembles[-1].members]
        # Qw - Qa + 1 = 2 fenced members are needed; one is stopped: a delete fences
        await cluster.stop_node(members[0], unregister=False)
        async with client_on(cluster, recovery_fence_timeout_s=0.5) as impatient:
            await impatient.delete_ledger(ledger.ledger_id, password="pw")
        with pytest.raises(pora.LedgerDeleted):
            await ledger.append(b"b")

    (tmp_path / "two").mkdir()
    async with local_cluster(tmp_path / "two", nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(3, 3, 2, password="pw")
        await ledger.append(b"a")
        members = [m.address for m in ledger.metadata.ensembles[-1].members]
        await cluster.stop_node(members[0])
        await cluster.stop_node(members[1], unregister=False)
        async with client_on(cluster, recovery_fence_timeout_s=0.5) as impatient:
            with pytest.raises(pora.DeleteFailed, match="call delete_ledger again"):
                await impatient.delete_ledger(ledger.ledger_id, password="pw")
            record = await cluster.store.read_ledger(ledger.ledger_id)
            assert record.value.deleting and record.value.state is LedgerState.IN_RECOVERY
            with pytest.raises(pora.LedgerDeleted):  # its ensemble changes are refused
                await ledger.append(b"b")
            await cluster.start_node(members[0])  # (wiped: it fences like any other, R17)
            await impatient.delete_ledger(ledger.ledger_id, password="pw")  # the retry
        with pytest.raises(NoSuchLedgerMetadata):
            await cluster.store.read_ledger(ledger.ledger_id)


async def test_a_delete_overtaken_by_another_raises_no_such_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deletes of one open ledger: the second marks the record, then the first
    finishes (record gone, nodes deleted) before the second fences. Its members answer
    "no such ledger", not "fenced": the delete says the ledger is gone, never
    DeleteFailed (which tells the caller to retry a delete that is done)."""
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster) as first,
        client_on(cluster, recovery_fence_timeout_s=0.5) as second,
    ):
        ledger = await first.create_ledger(3, 3, 2, password="pw")
        await ledger.append(b"a")
        overtaken: list[bool] = []

        class OvertakenRecovery(Recovery):
            async def fence(self) -> list[int]:
                if not overtaken:  # the second delete's fence: the first one ends first
                    overtaken.append(True)
                    await first.delete_ledger(ledger.ledger_id, password="pw")
                return await super().fence()

        monkeypatch.setattr(client_module, "Recovery", OvertakenRecovery)
        with pytest.raises(pora.NoSuchLedger):
            await second.delete_ledger(ledger.ledger_id, password="pw")
        assert overtaken
