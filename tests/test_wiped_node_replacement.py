"""R9: a node whose data dir was wiped and that came back at the same address (a new
instance id) is a new node: it may replace the instance that failed (its answers for
the old instance are never trusted, #2612), so a 3-node cluster with E=Qw=3 keeps
writing and can still be recovered."""

from __future__ import annotations

from pathlib import Path

import trio
from replicated_ledger_support import PASSWORD, make_ledger, payload, put
from replication_support import local_cluster
from waiting import wait_until_true
from writer_support import client_on, payload_on

from netio.security import master_key_from_password
from pora.client.replication.core.entry_format import encode_entry
from pora.client.replication.core.quorum import entry_write_set
from pora.meta.records import EnsembleMember, LedgerState


async def test_a_writer_replaces_a_wiped_node_by_its_new_instance(tmp_path: Path) -> None:
    """(a) C is wiped and restarted mid-write: appends go on with no error, the new
    ensemble names C's new instance, and every acknowledged entry reads back; (c) reads
    of entries from before the change skip C's new instance, even when it holds other
    bytes under their ids."""
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster, node_timeout_s=5.0, ensemble_change_timeout_s=20.0) as client,
    ):
        _, _, c = cluster.addresses
        ledger = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        old_c = next(m for m in ledger.metadata.ensembles[0].members if m.address == c)
        acknowledged: dict[int, bytes] = {}
        ten_acknowledged, wiped = trio.Event(), trio.Event()

        async def append_until_after_the_wipe() -> None:
            after_wipe = 0
            while after_wipe < 20:  # appends keep coming while C is down and after
                data = b"entry %d" % len(acknowledged)
                acknowledged[await ledger.append(data)] = data
                if len(acknowledged) >= 10:
                    ten_acknowledged.set()
                after_wipe += wiped.is_set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append_until_after_the_wipe)
            await ten_acknowledged.wait()
            await cluster.replace_data_dir(c)
            wiped.set()
        new_c = EnsembleMember(c, cluster.nodes[c].data_dir.instance_id)
        assert new_c != old_c

        async def changed() -> bool:
            record = await cluster.store.read_ledger(ledger.ledger_id)
            return len(record.value.ensembles) == 2

        await wait_until_true(changed, timeout_s=10.0)  # the change relists with backoff
        for _ in range(5):  # the new ensemble takes appends
            data = b"entry %d" % len(acknowledged)
            acknowledged[await ledger.append(data)] = data
        # R24: C's new instance holds other bytes under entry 0's id; they are no answer
        planted = encode_entry(ledger.ledger_id, 0, 5, b"wrong")
        await cluster.nodes[c].add_entry(
            ledger.ledger_id, 0, planted, master_key=master_key_from_password(PASSWORD)
        )
        await ledger.close()
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert record.state is LedgerState.CLOSED
        assert record.last_entry_id == max(acknowledged) == len(acknowledged) - 1
        assert len(record.ensembles) == 2
        assert new_c in record.ensembles[1].members
        assert old_c in record.ensembles[0].members
        first_of_change = record.ensembles[1].first_entry_id
        assert first_of_change >= 10
        reader = await client.open_ledger(ledger.ledger_id, password=PASSWORD)
        for entry_id, data in acknowledged.items():
            assert await reader.read(entry_id) == data, entry_id
        read = [pair async for pair in reader.read_entries(0, reader.last_entry_id)]
        assert read == sorted(acknowledged.items())
        for entry_id in range(first_of_change, record.last_entry_id + 1):  # R10's resends
            stored = await payload_on(cluster, c, ledger.ledger_id, entry_id)
            assert stored == acknowledged[entry_id], entry_id


async def test_recovery_re_adds_to_a_wiped_nodes_new_instance(tmp_path: Path) -> None:
    """(b) The writer is gone; C was wiped and restarted; only 3 nodes: the recovery's
    re-adds fail on C's old instance, and with Qa=3 every recovered entry falls short,
    so C's new instance replaces it (R20 with R9) and gets the entries."""
    async with local_cluster(tmp_path, nodes=3) as cluster:
        _, _, c = cluster.addresses
        record = await make_ledger(cluster, write_quorum=3, ack_quorum=3)
        await put(cluster, record.value, range(8), lac=lambda _: 3)
        await cluster.replace_data_dir(c)
        new_c = EnsembleMember(c, cluster.nodes[c].data_dir.instance_id)
        async with client_on(cluster, node_timeout_s=5.0) as client:
            reader = await client.open_ledger(record.value.ledger_id, password=PASSWORD)
            closed = (await cluster.store.read_ledger(record.value.ledger_id)).value
            assert closed.state is LedgerState.CLOSED
            assert reader.last_entry_id == closed.last_entry_id == 7
            # the recovery read from the highest LAC its fencing reads heard: 3 from A
            # or B, or -1 from C's new instance when it answered first (Qa=3: one fenced
            # member covers the ensemble); its re-adds start there
            last = closed.ensembles[-1]
            assert new_c in last.members and last.first_entry_id in (0, 4)
            for entry_id in range(8):
                assert await reader.read(entry_id) == payload(entry_id)
            # the recovered entries are on C's new instance too (R20)
            for entry_id in range(last.first_entry_id, 8):
                assert new_c in entry_write_set(closed, entry_id)
                stored = await cluster.nodes[c].read_entry(closed.ledger_id, entry_id)
                assert stored.endswith(payload(entry_id))
