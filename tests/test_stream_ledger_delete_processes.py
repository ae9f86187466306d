"""R26 under a stream, against real processes: three `pora serve` nodes, a stream
writer process appending from many tasks (tests/stream_writer_process.py), and the
ledger of its OPEN segment deleted with `delete_ledger` from this process (an operator
deleting a ledger that a stream holds). No append started after the delete returned
is acknowledged; every task is told `LedgerDeleted` at once (not after the writer
watched the document for a takeover that never comes), and the writer, ended by it,
leaves its block quietly. The next writer marks the segment LOST and writes on."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import trio
from cluster_process import pora_cluster_process
from test_stream_processes import logged
from waiting import wait_until

import pora
from pora import Position

WRITER_SCRIPT = Path(__file__).with_name("stream_writer_process.py")
WRITER_TASKS = 32
WAIT_S = 90.0
#: the writer process ends well within this after the delete returned: the writer's
#: appends fail once the nodes refuse the ledger, and nothing else is waited for (the
#: writer's watch of the document for a takeover or a seal is 10 s)
ENDS_WITHIN_S = 8.0


async def delete_under_a_stream_writer(url: str, log_path: Path) -> None:
    async with pora.connect(url) as client:
        stream = await client.create_stream("orders")
        command = [sys.executable, str(WRITER_SCRIPT), url, "orders", str(log_path)]
        writer = await trio.lowlevel.open_process([*command, str(WRITER_TASKS)], env=os.environ)
        try:
            await wait_until(lambda: len(logged(log_path)[0]) >= 300, WAIT_S)
            (segment,) = (await stream.info()).segments  # one segment: no rollover yet
            await client.delete_ledger(segment.ledger_id, password="")
            deleted_at = time.monotonic()
            acks_at_delete = len(logged(log_path)[0])
            with trio.fail_after(ENDS_WITHIN_S):
                status = await writer.wait()
            took_s = time.monotonic() - deleted_at
        finally:
            if writer.returncode is None:
                writer.kill()
            await writer.wait()
        acks, fenced, other = logged(log_path)
        assert status == 0, other  # (a traceback is on its stderr)
        assert fenced == []
        # every task was told its append failed because the ledger was deleted
        assert sorted(other) == sorted(
            f"deleted {task} LedgerDeleted" for task in range(WRITER_TASKS)
        ), (other, took_s)
        # an acknowledgement logged after the delete returned is one each task had
        # before the fence (answered, not yet logged): never an append started after
        assert len(acks) - acks_at_delete <= WRITER_TASKS
        with pytest.raises(pora.NoSuchLedger):
            await client.open_ledger(segment.ledger_id, password="")

        # the stream is written again: the next writer's takeover marks the segment
        # LOST, and readers are told where the loss is and where to resume
        async with stream.open_writer() as next_writer:
            assert await next_writer.append(b"again") == Position(1, 0)
        assert [s.lost for s in (await stream.info()).segments] == [True, False]
        with pytest.raises(pora.EntriesLost) as lost:
            async for _ in stream.read():
                pass
        assert (lost.value.segment, lost.value.resume_at) == (0, Position(1, 0))
        assert [item async for item in stream.read(from_=lost.value.resume_at)] == [
            (Position(1, 0), b"again")
        ]


@pytest.mark.slow
def test_deleting_a_streams_ledger_stops_its_writer_process_at_once(tmp_path: Path) -> None:
    with pora_cluster_process(tmp_path / "cluster", nodes=3) as url:
        trio.run(delete_under_a_stream_writer, url, tmp_path / "writer.log")
