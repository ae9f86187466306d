"""R9 with real `pora serve` processes: a node SIGKILLed mid-write, its data dir wiped,
restarted at the same address (a new instance id) on a 3-node cluster with E=Qw=3
Qa=2: the writer's appends go on with no error, the ensemble changes to the new
instance, and every acknowledged entry reads back."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import pytest
import trio
from test_node_registration import LEASE_S, nodes_in, serve, stop
from waiting import wait_until_true

import pora
from pora.client.replication.config import ClientConfig
from pora.meta.records import EnsembleMember, LedgerState
from pora.node.datadir import open_data_dir


@pytest.mark.slow
async def test_a_writer_goes_on_through_a_wiped_and_restarted_node(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    config = ClientConfig(node_timeout_s=3.0, ensemble_change_timeout_s=30.0)
    async with (
        contextlib.AsyncExitStack() as later,  # the restarted node, left last
        serve(tmp_path / "a", tmp_path, url) as _a,
        serve(tmp_path / "b", tmp_path, url) as _b,
        serve(tmp_path / "c", tmp_path, url) as c,
        pora.connect(url, config) as client,
    ):
        ledger = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password="pw"
        )
        old_c = EnsembleMember(c.address, open_data_dir(tmp_path / "c", create=False).instance_id)
        assert old_c in ledger.metadata.ensembles[0].members
        acknowledged: dict[int, bytes] = {}
        ten_acknowledged, restarted = trio.Event(), trio.Event()

        async def append_through_the_wipe() -> None:
            after = 0
            while after < 20:
                data = b"entry %d" % len(acknowledged)
                acknowledged[await ledger.append(data)] = data
                if len(acknowledged) >= 10:
                    ten_acknowledged.set()
                after += restarted.is_set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append_through_the_wipe)
            await ten_acknowledged.wait()
            assert await stop(c, signal.SIGKILL) == -signal.SIGKILL

            async def lease_gone() -> bool:  # the old instance's registration
                return c.address not in await nodes_in(url)

            await wait_until_true(lease_gone, LEASE_S * 10)
            wiped = tmp_path / "c-wiped"
            new = await later.enter_async_context(
                serve(wiped, tmp_path, url, "--listen", c.address)
            )
            assert new.address == c.address
            restarted.set()
        new_c = EnsembleMember(c.address, open_data_dir(wiped, create=False).instance_id)
        assert new_c != old_c

        async def changed() -> bool:
            return new_c in ledger.metadata.ensembles[-1].members

        await wait_until_true(changed, 30.0)
        for _ in range(5):  # the new ensemble takes appends
            data = b"entry %d" % len(acknowledged)
            acknowledged[await ledger.append(data)] = data
        await ledger.close()
        record = ledger.metadata
        assert record.state is LedgerState.CLOSED
        assert record.last_entry_id == len(acknowledged) - 1
        assert [m for m in record.ensembles[-1].members if m.address == c.address] == [new_c]
        reader = await client.open_ledger(ledger.ledger_id, password="pw")
        read = [pair async for pair in reader.read_entries(0, reader.last_entry_id)]
        assert read == sorted(acknowledged.items())
