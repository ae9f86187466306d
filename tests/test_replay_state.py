"""Replay reaches the state the journal's records say, whatever their mix: a node
that crashed before flushing anything comes back with every entry, every LAC and
every fence and close its journal holds, exactly as applied one record at a time.

Replay merges each ledger's consecutive entries into runs (journal/replay_runs.py);
this journal is made to break those runs in every way (other ledgers' records in
between, runs and single entries, retries, fences with recovery adds after them,
adds refused after a fence or a close) and to flush mid-replay."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import pora
from journal.format import BODY_HEADER_SIZE, CLOSE_KEEP_ALL, RecordFlag, RecordKind
from journal.request import Request
from journal.segment import SegmentWriter
from ledger.errors import NoSuchEntry

LEDGERS = 30
SEED = 34


@dataclass
class Expected:
    """A ledger as its records, applied one at a time, leave it."""

    entries: dict[int, bytes] = field(default_factory=dict)
    lac: int = -1
    fenced: bool = False
    sealed: int | None = None
    #: the seq of the ledger's last record: replay makes the ledger durable through it
    last_seq: int = -1

    @property
    def state(self) -> str:
        if self.sealed is not None:
            return "closed"
        return "fenced" if self.fenced else "open"

    def apply(self, request: Request) -> None:
        """What the ledger worker does with the record (ledger/worker.py)."""
        if request.kind is RecordKind.FENCE:
            self.fenced = True
        elif request.kind is RecordKind.CLOSE:
            self.sealed = max(self.entries, default=-1)
        elif request.kind is RecordKind.ENTRY:
            refused = self.sealed is not None or (
                self.fenced and not request.flags & RecordFlag.RECOVERY_ADD
            )
            if refused:
                return
            for index, body in enumerate(request.bodies):
                self.entries.setdefault(request.entry_id + index, bytes(body[BODY_HEADER_SIZE:]))
            self.lac = max(self.lac, request.lac)


def payload(rng: random.Random, ledger_id: int, entry_id: int) -> bytes:
    return f"{ledger_id}:{entry_id}:".encode() + rng.randbytes(rng.randrange(0, 300))


def ledger_script(rng: random.Random, ledger_id: int) -> list[Request]:
    """One ledger's records in its journal order."""
    script = [Request(RecordKind.KEY, ledger_id, 0, bytes([ledger_id]) * 20)]
    entries = rng.randrange(20, 400)
    fence_at = entries * 3 // 5 if ledger_id % 4 == 1 else None
    recovered_last: int | None = None
    entry_id = 0
    while entry_id < entries:
        flags = RecordFlag.NONE
        if fence_at is not None and entry_id >= fence_at:
            if entry_id == fence_at:
                script.append(Request(RecordKind.FENCE, ledger_id, 0))
                # the fenced writer's add is refused, and the recovery adds that follow
                # it with the next ids are taken: the refused add's request is not theirs
                refused = payload(rng, ledger_id, entry_id) + b"refused"
                script.append(Request(RecordKind.ENTRY, ledger_id, entry_id, refused))
                recovered_last = entry_id
                fence_at = -1
                entry_id += 1
                continue
            flags = RecordFlag.RECOVERY_ADD
        count = 1 if rng.random() < 0.5 else rng.randrange(2, 17)
        count = min(count, entries - entry_id)
        payloads = [payload(rng, ledger_id, entry_id + i) for i in range(count)]
        if count == 1:
            script.append(
                Request(RecordKind.ENTRY, ledger_id, entry_id, payloads[0], flags, lac=entry_id - 1)
            )
        else:
            bodies = [
                Request(RecordKind.ENTRY, ledger_id, entry_id + i, p, lac=entry_id + i - 1).bodies[
                    0
                ]
                for i, p in enumerate(payloads)
            ]
            script.append(
                Request.entry_run(
                    ledger_id, entry_id, bodies, entry_id + count - 2, flags, None, None, []
                )
            )
        if ledger_id % 5 == 0 and rng.random() < 0.1:
            # a retry of the last entry, journalled again with the same bytes
            last = entry_id + count - 1
            script.append(Request(RecordKind.ENTRY, ledger_id, last, payloads[-1], flags))
        entry_id += count
    if recovered_last is not None:  # the recovery adds the refused one's entry last
        script.append(
            Request(
                RecordKind.ENTRY,
                ledger_id,
                recovered_last,
                payload(rng, ledger_id, recovered_last),
                RecordFlag.RECOVERY_ADD,
            )
        )
    if ledger_id % 6 == 2:
        script.append(Request(RecordKind.CLOSE, ledger_id, CLOSE_KEEP_ALL))
        script.append(Request(RecordKind.ENTRY, ledger_id, entries, b"after the close"))
    return script


def write_crashed_journal(journal_dir: Path) -> dict[int, Expected]:
    """The ledgers' scripts interleaved at random into batches of a journal, as a node
    that crashed before any flush leaves it; what each ledger must come back as."""
    rng = random.Random(SEED)
    scripts = {ledger_id: ledger_script(rng, ledger_id) for ledger_id in range(1, LEDGERS + 1)}
    expected = {ledger_id: Expected() for ledger_id in scripts}
    order = [ledger_id for ledger_id, script in scripts.items() for _ in script]
    rng.shuffle(order)
    positions = dict.fromkeys(scripts, 0)
    records: list[Request] = []
    for ledger_id in order:
        records.append(scripts[ledger_id][positions[ledger_id]])
        positions[ledger_id] += 1
    writer = SegmentWriter(journal_dir, segment_bytes=256 << 10, first_seq=0)
    seq = 0
    while seq < len(records):
        batch = records[seq : seq + rng.randrange(1, 65)]
        writer.write_batch(batch, seq)
        writer.sync()
        for request in batch:
            expected[request.ledger_id].apply(request)
            expected[request.ledger_id].last_seq = request.seq
        seq += len(batch)
    writer.close()
    return expected


async def assert_holds(node: pora.Node, expected: dict[int, Expected]) -> None:
    for ledger_id, ledger in expected.items():
        info = node.ledger_info(ledger_id)
        stored = sorted(ledger.entries)
        last = ledger.sealed if ledger.sealed is not None else stored[-1]
        assert (info.state, info.first_entry_id, info.last_entry_id, info.entry_count) == (
            ledger.state,
            stored[0],
            last,
            len(stored),
        ), ledger_id
        assert info.payload_bytes == sum(map(len, ledger.entries.values())), ledger_id
        assert await node.read_lac(ledger_id) == (ledger.lac, stored[-1]), ledger_id
        entries = await node.read_range(
            ledger_id, 0, stored[-1] + 1, max_entries=10_000, max_bytes=1 << 30
        )
        assert entries == [(entry_id, ledger.entries[entry_id]) for entry_id in stored], ledger_id
        with pytest.raises(NoSuchEntry):
            await node.read_entry(ledger_id, stored[-1] + 1)


async def test_replay_restores_every_entry_lac_fence_and_close_of_a_mixed_journal(
    data_dir: Path,
) -> None:
    async with pora.open_node(data_dir):
        pass  # lay out the data dir
    expected = write_crashed_journal(data_dir / "journal")
    # small flushes: ledgers flush while the replay goes on, each up to a part's end
    async with pora.open_node(data_dir, memtable_flush_bytes=16 << 10) as node:
        report = node.statistics().recovery
        assert report.records_replayed == report.records_scanned
        assert report.ledgers_touched == set(expected)
        assert report.unflushed_ledgers == []
        for ledger_id, ledger in expected.items():
            assert node._registry.metas[ledger_id].durable_seq == ledger.last_seq, ledger_id
        await assert_holds(node, expected)
    # and from the entry logs and index alone, the journal gone
    async with pora.open_node(data_dir) as node:
        assert node.statistics().recovery.records_scanned == 0
        await assert_holds(node, expected)
