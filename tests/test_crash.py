"""Crash safety: SIGKILL a real writer process at random moments, over and over on
the same data dir (sometimes tearing the journal tail as a cut write would), and
check that every acknowledged entry reads back byte-identical after each restart.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
from crash_support import kill_writer, payload_for

import pora
from journal.format import (
    BATCH_HEADER,
    BATCH_MAGIC,
    RECORD_HEADER_SIZE,
    SEGMENT_HEADER,
    RecordKind,
    round_up_to_block,
)
from journal.reader import JournalScanner
from journal.request import Request
from journal.segment import encode_batch, list_segments

#: the ledger of the whole batches a test writes after a torn one: never acknowledged,
#: so recovery must drop them with it
UNACKNOWLEDGED_LEDGER = 424242
#: the most rounds added while no kill has landed in a recycled segment
EXTRA_ROUNDS_MAX = 6


def tear_journal_tail(journal_dir: Path, rng: random.Random, *, whole_after: bool) -> str | None:
    """Leave a half-written group commit at the end of the journal, as a crash
    during a write would. Only unacknowledged bytes are touched. With `whole_after`
    a whole batch follows the torn one: the node writes the next group while the one
    before syncs (syncs_in_flight_max = 2), and the disk may keep the later one.
    Returns what it left ("torn", "torn then whole"), None if there is no journal."""
    segments = list_segments(journal_dir)
    if not segments:
        return None
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
    torn_records = 3
    header = BATCH_HEADER.pack(BATCH_MAGIC, 0xDEADBEEF, 4096, torn_records, next_seq)
    torn = header + rng.randbytes(rng.randint(1, 3000))
    with open(last_segment.path, "r+b") as f:
        unsynced_batches_max = SEGMENT_HEADER.unpack(f.read(SEGMENT_HEADER.size))[2]
        assert unsynced_batches_max == 2, "the node's segments record its overlap"
        f.seek(end)
        f.write(torn)
        if whole_after:
            whole = [
                Request(RecordKind.ENTRY, UNACKNOWLEDGED_LEDGER, entry_id, b"never acked")
                for entry_id in range(2)
            ]
            f.seek(round_up_to_block(end + len(torn)))
            f.write(encode_batch(whole, next_seq + torn_records))
            return "torn then whole"
    return "torn"


def last_segment_is_recycled(journal_dir: Path) -> bool:
    """Whether the last segment is a recycled file: batches of its earlier life, below
    its first seq, lie after its data (journal/spares.py)."""
    segments = list_segments(journal_dir)
    if not segments:
        return False
    data = segments[-1].path.read_bytes()
    position = data.find(b"PBAT")
    while position >= 0:
        if position % 512 == 0 and BATCH_HEADER.unpack_from(data, position)[4] < (
            segments[-1].first_seq
        ):
            return True
        position = data.find(b"PBAT", position + 1)
    return False


async def check_acknowledged(data_dir: Path, acked: set[tuple[int, int]]) -> None:
    """Open the node on `data_dir` (its recovery) and check that every acknowledged
    entry reads back byte-identical, that each ledger's last entry is at least its
    highest acknowledged one, and that the never-acknowledged ledger is gone. The
    entries are read a page of ids at a time (`read_range_page`): one read each would
    spend most of a crash test on tens of thousands of calls."""
    acked_ids: dict[int, list[int]] = {}
    for ledger_id, entry_id in acked:
        acked_ids.setdefault(ledger_id, []).append(entry_id)
    async with pora.open_node(data_dir) as node:
        for ledger_id, entry_ids in sorted(acked_ids.items()):
            highest = max(entry_ids)
            stored = await stored_entries(node, ledger_id, min(entry_ids), highest)
            for entry_id in sorted(entry_ids):
                assert stored.get(entry_id) == payload_for(ledger_id, entry_id), (
                    ledger_id,
                    entry_id,
                )
            assert await node.last_entry_id(ledger_id) >= highest
        assert UNACKNOWLEDGED_LEDGER not in {info.ledger_id for info in node.ledgers()}


async def stored_entries(
    node: pora.Node, ledger_id: int, first: int, last: int
) -> dict[int, bytes]:
    """Every entry the node stores of `ledger_id` with an id in [first, last]."""
    stored: dict[int, bytes] = {}
    while first <= last:
        page, more = await node.read_range_page(ledger_id, first, last)
        stored.update(page)
        if not more:
            break
        first = page[-1][0] + 1
    return stored


@pytest.mark.slow
def test_every_acknowledged_entry_survives_repeated_sigkills(data_dir: Path) -> None:
    rng = random.Random(20261122)
    acked: set[tuple[int, int]] = set()
    tears: list[str] = []
    recycled_tails = 0
    for round_number in range(8):
        # early kills often land during startup recovery; later ones mid-load
        kill_after_s = rng.choice([0.3, 0.6, 1.0, 1.5, 2.0])
        new_acks = kill_writer(
            data_dir, kill_after_s, after_ready=False, writers=16, ledgers_per_writer=4
        )
        acked |= new_acks
        recycled_tails += last_segment_is_recycled(data_dir / "journal")
        # every other round, the two kinds of tear in turn (not by chance: a run
        # must see both)
        whole_after = len(tears) % 2 == 1
        if round_number % 2 == 1 and (
            tear := tear_journal_tail(data_dir / "journal", rng, whole_after=whole_after)
        ):
            tears.append(tear)
        if round_number % 3 == 2:
            # a clean open in between: recovery here, then the writer carries on
            trio.run(check_acknowledged, data_dir, acked)
    # how far a writer gets before its kill depends on the machine's load: on a busy
    # one, the rounds above may all end before a segment was recycled. Kills after
    # the writer has had time to roll and trim reach one: a run must see it
    for _ in range(EXTRA_ROUNDS_MAX):
        if recycled_tails:
            break
        acked |= kill_writer(data_dir, 2.0, after_ready=True, writers=16, ledgers_per_writer=4)
        recycled_tails += last_segment_is_recycled(data_dir / "journal")
    trio.run(check_acknowledged, data_dir, acked)
    assert len(acked) > 1000, "the writer should have been acknowledged many times"
    assert set(tears) == {"torn", "torn then whole"}
    # kills also landed while the node wrote into a segment recycled from a trimmed one
    assert recycled_tails > 0, recycled_tails
