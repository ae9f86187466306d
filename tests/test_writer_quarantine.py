"""Short failures of healthy nodes (R9's quarantine): a member that failed for a
ledger is not chosen again for `node_quarantine_s`, then it may be, so a writer
whose members blip one after another, more times than there are nodes, keeps
writing instead of running out of nodes."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing
from replication_support import Fault, local_cluster
from writer_support import append_all, client_on

QUARANTINE_S = 1.0


async def test_more_blips_than_nodes_leave_the_writer_writing(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # four nodes, E=3: one spare. Each blip fails a member (its connection lost) until
    # the writer replaced it, then the node is back, healthy. From the second blip on,
    # the only node outside the ensemble is one that failed before: the writer waits
    # for its quarantine to end (R12, within ensemble_change_timeout_s) and takes it.
    mock_clock.autojump_threshold = 0.1
    async with (
        local_cluster(tmp_path, nodes=4) as cluster,
        client_on(
            cluster,
            node_timeout_s=5.0,
            ensemble_change_timeout_s=10.0,
            node_quarantine_s=QUARANTINE_S,
        ) as client,
    ):
        writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        written = 0
        failed: list[str] = []
        blips = 5  # more than the nodes
        for blip in range(blips):
            members = writer.metadata.ensembles[-1].members
            victim = members[blip % 3]
            failed.append(victim.address)
            cluster.set_fault(victim.address, Fault.FAIL)
            started = trio.current_time()
            # appends go on on the two others (Qa=2) and find the member failed
            assert await append_all(writer, 20, first=written) == list(range(written, written + 20))
            written += 20
            while victim in writer.metadata.ensembles[-1].members:
                assert trio.current_time() - started < 10.0, f"blip {blip}: never replaced"
                await trio.sleep(0.5)
            cluster.set_fault(victim.address, Fault.NONE)
        # five failures on four nodes: each node failed for the ledger and was taken again
        assert {m.address for m in writer.metadata.ensembles[-1].members} <= set(failed)
        assert await append_all(writer, 20, first=written) == list(range(written, written + 20))
        await writer.close()
        assert writer.metadata.last_entry_id == written + 19
