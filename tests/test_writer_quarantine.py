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


async def test_a_member_that_blipped_on_a_cluster_with_no_spare_takes_its_position_back(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # three nodes, E=3 Qw=3 Qa=2: no spare. A member fails (its connection lost) and
    # is healthy again at once; appends go on on the other two (Qa=2), and once its
    # quarantine ended the member takes its own position back (R9) from LAC + 1, so
    # the writer neither fails with NotEnoughNodes nor stays on two copies for good
    mock_clock.autojump_threshold = 0.1
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(
            cluster,
            node_timeout_s=5.0,
            ensemble_change_timeout_s=3 * QUARANTINE_S,
            node_quarantine_s=QUARANTINE_S,
        ) as client,
    ):
        writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        members = writer.metadata.ensembles[-1].members
        written = 0
        for blip in range(3):
            victim = members[blip % 3]
            cluster.set_fault(victim.address, Fault.FAIL)
            assert await append_all(writer, 20, first=written) == list(range(written, written + 20))
            written += 20
            cluster.set_fault(victim.address, Fault.NONE)
            changes = len(writer.metadata.ensembles)
            started = trio.current_time()
            while len(writer.metadata.ensembles) == changes:
                assert trio.current_time() - started < 3 * QUARANTINE_S, f"blip {blip}: stuck"
                assert await append_all(writer, 1, first=written) == [written]
                written += 1
                await trio.sleep(0.2)
            last = writer.metadata.ensembles[-1]
            assert last.members == members, f"blip {blip}: {last.members}"
        assert await append_all(writer, 20, first=written) == list(range(written, written + 20))
        written += 20
        await writer.close()
        assert writer.metadata.last_entry_id == written - 1
        # the entries after the last change are on all three nodes again
        for member in members:
            channel = await client._pool.channel(member.address)
            data, _ = await channel.read_entry(writer.ledger_id, written - 1)
            assert data
