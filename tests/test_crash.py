"""Crash safety: SIGKILL a real writer process at random moments, over and over on
the same data dir (sometimes tearing the journal tail as a cut write would), and
check that every acknowledged entry reads back byte-identical after each restart.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import trio

import pora
from journal.format import BATCH_HEADER, BATCH_MAGIC, RECORD_HEADER_SIZE, round_up_to_block
from journal.reader import JournalScanner
from journal.segment import list_segments

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from crash_writer import payload_for  # noqa: E402

WRITER = ROOT / "scripts" / "crash_writer.py"


def run_writer_until_killed(data_dir: Path, kill_after_s: float) -> set[tuple[int, int]]:
    """Start the writer, SIGKILL it after `kill_after_s`, return what it acknowledged."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, str(WRITER), str(data_dir), "--writers", "16"],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    stdout_fd = child.stdout.fileno()
    chunks: list[bytes] = []

    def drain() -> None:  # so the child never blocks on a full pipe
        while chunk := os.read(stdout_fd, 65536):
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    time.sleep(kill_after_s)
    child.send_signal(signal.SIGKILL)
    child.wait()
    reader.join()
    acks: set[tuple[int, int]] = set()
    lines = b"".join(chunks).split(b"\n")
    for line in lines[:-1]:  # the last piece may be cut mid-line: not a whole report
        if line.startswith(b"ack "):
            _, ledger_id, entry_id = line.split()
            acks.add((int(ledger_id), int(entry_id)))
    return acks


def tear_journal_tail(journal_dir: Path, rng: random.Random) -> bool:
    """Leave a half-written group commit at the end of the journal, as a crash
    during a write would. Only unacknowledged bytes are touched."""
    segments = list_segments(journal_dir)
    if not segments:
        return False
    last_segment = segments[-1]
    last_record = None
    for batch in JournalScanner(journal_dir).batches():
        last_record = batch[-1]
    if last_record is not None and last_record.segment == last_segment.path:
        end = round_up_to_block(last_record.offset + RECORD_HEADER_SIZE + len(last_record.payload))
        next_seq = last_record.seq + 1
    else:
        end = 512
        next_seq = last_segment.first_seq
    header = BATCH_HEADER.pack(BATCH_MAGIC, 0xDEADBEEF, 4096, 3, next_seq)
    with open(last_segment.path, "r+b") as f:
        f.seek(end)
        f.write(header + rng.randbytes(rng.randint(1, 3000)))
    return True


async def check_acknowledged(data_dir: Path, acked: set[tuple[int, int]]) -> None:
    async with pora.open_node(data_dir) as node:
        highest: dict[int, int] = {}
        for ledger_id, entry_id in sorted(acked):
            got = await node.read_entry(ledger_id, entry_id)
            assert got == payload_for(ledger_id, entry_id), (ledger_id, entry_id)
            highest[ledger_id] = max(highest.get(ledger_id, -1), entry_id)
        for ledger_id, entry_id in highest.items():
            assert await node.last_entry_id(ledger_id) >= entry_id


def test_every_acknowledged_entry_survives_repeated_sigkills(data_dir: Path) -> None:
    rng = random.Random(20261122)
    acked: set[tuple[int, int]] = set()
    torn = 0
    for round_number in range(8):
        # early kills often land during startup recovery; later ones mid-load
        kill_after_s = rng.choice([0.3, 0.6, 1.0, 1.5, 2.0])
        new_acks = run_writer_until_killed(data_dir, kill_after_s)
        acked |= new_acks
        if rng.random() < 0.5 and tear_journal_tail(data_dir / "journal", rng):
            torn += 1
        if round_number % 3 == 2:
            # a clean open in between: recovery here, then the writer carries on
            trio.run(check_acknowledged, data_dir, acked)
    trio.run(check_acknowledged, data_dir, acked)
    assert len(acked) > 1000, "the writer should have been acknowledged many times"
    assert torn > 0
