"""Helpers of the CLI tests: data dirs made by the real engine, crashed ones made by
SIGKILLing the real crash writer, and running `pora.cli.main` in-process."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from crash_support import kill_writer, payload_for

import pora
from journal.format import BATCH_HEADER, BATCH_HEADER_SIZE, SEGMENT_HEADER_SIZE, round_up_to_block
from journal.reader import JournalScanner
from journal.segment import list_segments
from pora.cli import main

#: the ledgers `make_data_dir` writes, and what it does to them
OPEN_LEDGER, CLOSED_LEDGER, FENCED_LEDGER, SEALED_LEDGER = 7, 8, 9, 300
ENTRIES_PER_LEDGER = 12
SEAL_AT = 5
#: the master key of the fenced ledger (the others have the empty key)
FENCED_KEY = b"fence-key"
#: the last-add-confirmed piggybacked on the open ledger's adds
LAC_LAG = 2


def acked_payload(ledger_id: int, entry_id: int) -> bytes:
    """What the crash writer adds as (ledger_id, entry_id)."""
    return payload_for(ledger_id, entry_id)


def payload(ledger_id: int, entry_id: int) -> bytes:
    return f"ledger {ledger_id} entry {entry_id} ".encode() * (1 + entry_id % 4)


async def _populate(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        for ledger_id in (OPEN_LEDGER, CLOSED_LEDGER, FENCED_LEDGER, SEALED_LEDGER):
            key = FENCED_KEY if ledger_id == FENCED_LEDGER else b""
            for entry_id in range(ENTRIES_PER_LEDGER):
                await node.add_entry(
                    ledger_id,
                    entry_id,
                    payload(ledger_id, entry_id),
                    master_key=key,
                    last_add_confirmed=max(entry_id - LAC_LAG, -1),
                )
        await node.close_ledger(CLOSED_LEDGER)
        await node.fence_ledger(FENCED_LEDGER, master_key=FENCED_KEY)
        await node.close_ledger(SEALED_LEDGER, SEAL_AT)


def make_data_dir(data_dir: Path) -> Path:
    """A data dir written and cleanly closed by the engine: an open, a closed, a fenced
    ledger, and one closed below its last stored entry."""
    trio.run(_populate, data_dir)
    return data_dir


@dataclass(frozen=True)
class CliResult:
    status: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.out.splitlines() if line]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> CliResult:
    capsys.readouterr()  # drop anything printed before
    status = main(list(argv))
    captured = capsys.readouterr()
    return CliResult(status, captured.out, captured.err)


# --- a node left without its clean exit, its journal rolled into segments -------------------


ENTRY_PAYLOAD = b"p" * 1500


class Abandoned(Exception):
    """Raised inside `open_node` to leave it without the clean exit that flushes every
    ledger and empties the journal: the journal stays as a crash leaves it."""


async def write_and_abandon(
    data_dir: Path, segments_wanted: int, *, trim_first: bool, last_batch_ledgers: int = 0
) -> None:
    """Add entries until the journal has `segments_wanted` segments (after a trim, if
    `trim_first`, so the journal no longer starts at seq 0), then, with
    `last_batch_ledgers`, one submission adding entry 0 to that many new ledgers from
    ledger 100 on (one group commit: a KEY and an ENTRY record each), then abandon
    the node."""
    journal_dir = data_dir / "journal"

    async def fill(node: pora.Node, count: int) -> None:
        entry_id = await node.last_entry_id(1) + 1 if node.ledgers() else 0
        while len(list_segments(journal_dir)) < count:
            await node.add_entry(1, entry_id, ENTRY_PAYLOAD)
            entry_id += 1

    async def write_then_abandon(node: pora.Node) -> None:
        if trim_first:
            await fill(node, 3)
            assert await node.reclaim_journal() >= 1
        await fill(node, segments_wanted)
        if last_batch_ledgers:
            adds = [(100 + i, 0, ENTRY_PAYLOAD) for i in range(last_batch_ledgers)]
            assert await node.add_entries(adds) == [None] * last_batch_ledgers
        raise Abandoned

    try:
        # small segments that roll every few adds; no spares, so nothing trims by itself
        async with pora.open_node(
            data_dir, segment_bytes=8192, spare_segments_max=0, trim_interval_ms=3_600_000.0
        ) as node:
            await write_then_abandon(node)
    except* Abandoned:
        pass


# --- a node stopped between a flush and the next ------------------------------------------

#: the ledger `cut_flush_copy` writes: CUT_FLUSHED entries flushed, CUT_PENDING more
#: only in the journal
CUT_LEDGER, CUT_FLUSHED, CUT_PENDING = 21, 10, 3


async def _write_then_copy(live: Path, destination: Path) -> None:
    async with pora.open_node(
        live,
        flush_interval_ms=3_600_000.0,
        trim_interval_ms=3_600_000.0,
        segment_bytes=1 << 20,
        spare_segments_max=0,
    ) as node:
        for entry_id in range(CUT_FLUSHED + CUT_PENDING):
            if entry_id == CUT_FLUSHED:
                await node._registry.flush_all()
            await node.add_entry(CUT_LEDGER, entry_id, payload(CUT_LEDGER, entry_id))
        # the node is idle: its files are what a SIGKILL now would leave
        shutil.copytree(live, destination)


def cut_flush_copy(live: Path, destination: Path) -> Path:
    """At `destination`, the data dir of a node killed with CUT_LEDGER's first
    CUT_FLUSHED entries flushed and indexed and the next CUT_PENDING acknowledged
    (journalled) only: the same state every time, unlike a kill at a random moment."""
    trio.run(_write_then_copy, live, destination)
    return destination


# --- a node killed mid-write ----------------------------------------------------------------


@dataclass(frozen=True)
class Crashed:
    data_dir: Path
    acked: frozenset[tuple[int, int]]


_crashed_template: Crashed | None = None


def crashed_copy(tmp_path_factory: pytest.TempPathFactory, destination: Path) -> Crashed:
    """A copy of a data dir whose writer was SIGKILLed mid-load (made once per run)."""
    global _crashed_template  # noqa: PLW0603 -- one crash serves every test of the run
    if _crashed_template is None:
        template = tmp_path_factory.mktemp("crashed") / "pora-data"
        acked = kill_writer(template, 0.8, after_ready=True)
        assert acked, "the writer acknowledged nothing before it was killed"
        _crashed_template = Crashed(template, acked)
    shutil.copytree(_crashed_template.data_dir, destination)
    return Crashed(destination, _crashed_template.acked)


def end_of_journal_data(journal_dir: Path) -> tuple[Path, int]:
    """The last segment and the block boundary after its last whole batch, as the
    journal's own scanner finds it. Past it lies whatever the file held: zeros in a
    fresh segment, stale batches of its earlier life in a recycled one."""
    last_segment = list_segments(journal_dir)[-1].path
    end = SEGMENT_HEADER_SIZE
    for batch in JournalScanner(journal_dir).batches():
        first = batch[0]
        if first.segment == last_segment:
            batch_offset = first.offset - BATCH_HEADER_SIZE
            with open(last_segment, "rb") as file:
                file.seek(batch_offset)
                records_length = BATCH_HEADER.unpack(file.read(BATCH_HEADER_SIZE))[2]
            end = round_up_to_block(batch_offset + BATCH_HEADER_SIZE + records_length)
    return last_segment, end


async def _read_acked(data_dir: Path, acked: frozenset[tuple[int, int]]) -> None:
    async with pora.open_node(data_dir) as node:
        for ledger_id, entry_id in sorted(acked):
            got = await node.read_entry(ledger_id, entry_id)
            assert got == payload_for(ledger_id, entry_id), (ledger_id, entry_id)


def assert_every_ack_readable(data_dir: Path, acked: frozenset[tuple[int, int]]) -> None:
    trio.run(_read_acked, data_dir, acked)
