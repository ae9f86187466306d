"""What no client sends, to the live nodes of a ledger a writer process is writing
(three `pora serve` nodes, E=3 Qw=3 Qa=2, 64 tasks): every keyed request with a wrong
password (adds at the next ids and far ahead with a huge piggybacked LAC, a fence, a
fencing read and LAC read, a WRITE_LAC far ahead, a close, a delete), and frames with
a length below the header and far past the limit. Each is refused; none fences the
ledger, moves a node's LAC or stores an entry; the nodes keep serving the writer,
which never fails; a recovery holds every acknowledged entry and nothing else."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio
from cluster_process import pora_cluster_process
from net_helpers import raw_connection, receive_responses
from test_replication_processes import (
    ACKS_BETWEEN_FAULTS,
    ledger_record,
    read_log,
    recovered_with_every_ack,
    wait_for_acks,
)

import pora
from netio import frames as f
from netio.security import master_key_from_password

WRITER_SCRIPT = Path(__file__).with_name("replication_writer_process.py")
FAR = 10**15
WRONG = "not the password"


async def refused_everything_keyed(address: str, ledger_id: int, next_id: int) -> None:
    wrong_key = master_key_from_password(WRONG)
    async with pora.connect_node(address) as node:
        for entry_id, lac in ((next_id, FAR), (FAR, FAR)):
            with pytest.raises(pora.Unauthorized):
                await node.add_entry(
                    ledger_id, entry_id, b"forged", password=WRONG, last_add_confirmed=lac
                )
        with pytest.raises(pora.Unauthorized):
            await node.fence_ledger(ledger_id, password=WRONG)
        with pytest.raises(pora.Unauthorized):
            await node.read_entry(ledger_id, 0, fence=True, password=WRONG)
        with pytest.raises(pora.Unauthorized):
            await node.read_lac(ledger_id, fence_key=wrong_key)
        with pytest.raises(pora.Unauthorized):
            await node.write_lac(ledger_id, FAR, master_key=wrong_key)
        with pytest.raises(pora.Unauthorized):
            await node.close_ledger(ledger_id, 0, password=WRONG)
        with pytest.raises(pora.Unauthorized):
            await node.delete_ledger(ledger_id, password=WRONG)
        assert await node.last_add_confirmed(ledger_id) < FAR
        with pytest.raises(pora.NoSuchEntry):
            await node.read_entry(ledger_id, FAR)


async def malformed_frames_close_their_connection(address: str) -> None:
    for length in (3, 2**31):  # below the header; far past frame_bytes_max
        stream = await raw_connection(address)
        try:
            await stream.send_all(f.HEADER.pack(length, f.PROTOCOL_VERSION, 1, 0, 0, 9))
            _, closed = await receive_responses(stream, 2)
            assert closed
        finally:
            await stream.aclose()


async def hostile_requests_during_writes(url: str, log_path: Path) -> None:
    command = [sys.executable, str(WRITER_SCRIPT), url, str(log_path), "64"]
    writer = await trio.lowlevel.open_process(command, env=os.environ)
    try:
        before = await wait_for_acks(log_path, ACKS_BETWEEN_FAULTS, writer)
        assert before.ledger_id is not None
        ledger_id = before.ledger_id
        for member in (await ledger_record(url, ledger_id)).ensembles[-1].members:
            await refused_everything_keyed(member.address, ledger_id, max(before.acks) + 1)
            await malformed_frames_close_their_connection(member.address)
        # the writer was told nothing of it
        at_end = len(read_log(log_path).acks)
        await wait_for_acks(log_path, at_end + ACKS_BETWEEN_FAULTS, writer)
        writer.kill()
        await writer.wait()
    finally:
        if writer.poll() is None:
            writer.kill()
        await writer.wait()
    record = await recovered_with_every_ack(url, ledger_id, log_path, dead=set())
    assert record.last_entry_id < FAR
    assert len(record.ensembles) == 1  # no member failed for the writer


@pytest.mark.slow
def test_a_client_without_the_password_changes_nothing_on_live_nodes(tmp_path: Path) -> None:
    with pora_cluster_process(tmp_path / "cluster", nodes=3) as url:
        trio.run(hostile_requests_during_writes, url, tmp_path / "writer.log")
