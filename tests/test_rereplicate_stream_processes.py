"""A11 with real processes (docs/rereplication.md): five `pora serve` nodes, a stream
whose writer process (tests/stream_writer_process.py) is SIGKILLed with its segment
OPEN, then a node of that segment's last ensemble SIGKILLed and wiped.
`pora rereplicate --open-grace-s 0` takes the stream over by its own rules and
repairs the segment; a second audit is clean; the subscriber, which ran throughout,
has every acknowledged entry once, in order, on every replica byte for byte; and a
new live writer opens the stream and appends after it. On SQLite."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from pathlib import Path

import pytest
import trio
from rereplication_support import (
    audit_json,
    check_every_replica,
    five_nodes,
    fragments_naming,
    json_lines,
    pora_cli,
    records,
)
from test_stream_processes import WRITER_SCRIPT, logged
from waiting import wait_until

import pora
from pora.meta.records import LedgerState

WAIT_S = 90.0


@pytest.mark.slow
async def test_an_abandoned_streams_open_segment_is_taken_over_and_repaired(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    log_path = tmp_path / "writer.log"
    async with five_nodes(tmp_path, url) as cluster, pora.connect(url) as client:
        stream = await client.create_stream("orders", 3, 3, 2)
        seen: list[tuple[pora.Position, bytes]] = []

        async def subscribe() -> None:
            async for item in stream.subscribe():
                seen.append(item)

        command = [sys.executable, str(WRITER_SCRIPT), url, "orders", str(log_path), "4"]
        writer = await trio.lowlevel.open_process(command, env=os.environ)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscribe)
                await wait_until(lambda: len(logged(log_path)[0]) >= 200, WAIT_S)
                writer.send_signal(signal.SIGKILL)
                await writer.wait()
                acks, _, other = logged(log_path)
                assert other == []
                segment = (await stream.info()).segments[-1]
                assert segment.state.value == "OPEN"
                found = await records(url)
                victim = found[segment.ledger_id].ensembles[-1].members[0].address
                await cluster.kill_and_wipe(victim)

                status, report = audit_json(url)
                assert status == 1
                listed = {
                    (f["ledger"], f["fragment"]["last_entry"]) for f in report["under_replicated"]
                }
                assert (segment.ledger_id, None) in listed
                assert {ledger_id for ledger_id, _ in listed} == {segment.ledger_id}

                done = pora_cli("rereplicate", "--metadata", url, "--json", "--open-grace-s", "0")
                assert done.returncode == 0, done.stdout + done.stderr
                events = json_lines(done.stdout)
                assert [(e["event"], e["ledger"]) for e in events[:-1]] == [
                    ("recovered", segment.ledger_id),
                    ("repaired", segment.ledger_id),
                ]
                assert events[0]["stream"] == "orders"
                assert events[-1]["failed"] == 0

                # the subscriber goes on past the takeover to the segment's end
                await wait_until(lambda: set(acks) <= {p for p, _ in seen}, WAIT_S)
                nursery.cancel_scope.cancel()
        finally:
            if writer.returncode is None:
                writer.kill()
                await writer.wait()

        status, report = audit_json(url)
        assert (status, report["under_replicated"]) == (0, [])
        closed = (await records(url))[segment.ledger_id]
        assert closed.state is LedgerState.CLOSED
        assert fragments_naming(await records(url), victim) == set()
        positions = [position for position, _ in seen]
        assert positions == sorted(set(positions))  # each once, in order
        payloads = dict(seen)
        for position, digest in acks.items():
            assert hashlib.sha256(payloads[position]).hexdigest() == digest
        # every entry of the segment is on every member of its write set, byte for byte
        in_segment = {p.entry: data for p, data in seen if p.segment == segment.seq}
        assert await check_every_replica(url, {segment.ledger_id: in_segment}) > 0

        # the stream is clean for the next writer: it takes over and appends after it
        async with stream.open_writer() as next_writer:
            after = await next_writer.append(b"after the repair")
        assert after > max(acks)
        assert [item async for item in stream.read(from_=after)] == [(after, b"after the repair")]
