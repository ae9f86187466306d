"""The journal watermark: a lost journal segment is refused by every way of opening
the journal (the node, `pora serve`, `pora recover`, `pora verify`, `pora journal
verify`), with the missing seqs and files named, instead of replaying what is left
as if nothing were missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from cli_support import ENTRY_PAYLOAD, run_cli, write_and_abandon

import pora
from journal.errors import JournalFormatError, JournalGap
from journal.segment import SegmentInfo, list_segments
from journal.watermark import (
    WATERMARK_NAME,
    JournalState,
    Watermark,
    decode_watermark,
    encode_watermark,
    read_watermark,
    write_watermark,
)
from pora.node.datadir import MARKER_NAME

Capsys = pytest.CaptureFixture[str]


def _abandoned_journal(data_dir: Path, segments_wanted: int) -> list[SegmentInfo]:
    trio.run(lambda: write_and_abandon(data_dir, segments_wanted, trim_first=True))
    segments = list_segments(data_dir / "journal")
    assert len(segments) == segments_wanted
    watermark = read_watermark(data_dir / "journal")
    # trimmed: the journal starts past seq 0, where a lost segment would not show
    assert watermark == Watermark(JournalState.HOLDING, segments[0].first_seq)
    assert watermark.first_seq > 0
    return segments


def _open_node_error(data_dir: Path) -> JournalGap:
    async def open_it() -> None:
        async with pora.open_node(data_dir):
            pass

    with pytest.RaisesGroup(JournalGap, allow_unwrapped=True, flatten_subgroups=True) as caught:
        trio.run(open_it)
    (gap,) = _leaves(caught.value)
    assert isinstance(gap, JournalGap)
    return gap


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


def _assert_every_way_in_refuses(data_dir: Path, capsys: Capsys, expected: str) -> None:
    """The node, `pora serve`, `pora recover` (also --dry-run), `pora verify` and
    `pora journal verify` all refuse the journal, saying `expected`, and change
    nothing: the refusal stays."""
    before = sorted(p.name for p in (data_dir / "journal").iterdir())
    gap = _open_node_error(data_dir)
    assert expected in str(gap) and "Acknowledged entries may be lost" in str(gap)

    for argv in (["recover"], ["recover", "--dry-run"]):
        recovered = run_cli(capsys, *argv, "--data-dir", str(data_dir))
        assert recovered.status == 1, argv
        assert expected in recovered.err, argv

    verified = run_cli(capsys, "verify", "--json", "--data-dir", str(data_dir))
    assert verified.status == 1
    problems = verified.json()["problems"]
    assert [p["kind"] for p in problems] == ["journal-gap"]
    assert expected in problems[0]["message"]

    journal = run_cli(capsys, "journal", "verify", "--json", "--data-dir", str(data_dir))
    assert journal.status == 1
    problem = journal.json()["problem"]
    assert problem["kind"] == "gap" and expected in problem["reason"]
    table = run_cli(capsys, "journal", "verify", "--data-dir", str(data_dir))
    assert table.status == 1 and "GAP:" in table.out and "The journal has a gap" in table.out

    served = subprocess.run(
        [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
         "--listen", "127.0.0.1:0", "--log-format", "logfmt"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert served.returncode == 1
    assert "cannot serve" in served.stderr and expected in served.stderr
    assert sorted(p.name for p in (data_dir / "journal").iterdir()) == before


@pytest.mark.slow
def test_a_lost_oldest_segment_is_refused_everywhere(data_dir: Path, capsys: Capsys) -> None:
    oldest, newest = _abandoned_journal(data_dir, 2)
    oldest.path.unlink()
    missing = f"seqs {oldest.first_seq}-{newest.first_seq - 1} are in no segment"
    _assert_every_way_in_refuses(
        data_dir, capsys, f"{missing}: missing before {newest.path.name}, the first segment"
    )
    gap = _open_node_error(data_dir)
    assert (gap.first_missing, gap.last_missing) == (oldest.first_seq, newest.first_seq - 1)


@pytest.mark.slow
def test_a_lost_middle_segment_is_refused_with_the_files_around_it(
    data_dir: Path, capsys: Capsys
) -> None:
    first, middle, last = _abandoned_journal(data_dir, 3)
    middle.path.unlink()
    _assert_every_way_in_refuses(
        data_dir,
        capsys,
        f"seqs {middle.first_seq}-{last.first_seq - 1} are in no segment: "
        f"{first.path.name} ends at seq {middle.first_seq - 1} and {last.path.name} starts "
        f"at seq {last.first_seq}",
    )


@pytest.mark.slow
def test_a_journal_with_every_segment_lost_is_refused(data_dir: Path, capsys: Capsys) -> None:
    segments = _abandoned_journal(data_dir, 2)
    for segment in segments:
        segment.path.unlink()
    _assert_every_way_in_refuses(
        data_dir,
        capsys,
        f"holds no journal segment: seqs from {segments[0].first_seq} on are missing",
    )


def test_a_restored_segment_replays_everything(data_dir: Path) -> None:
    oldest, _newest = _abandoned_journal(data_dir, 2)
    saved = oldest.path.read_bytes()
    oldest.path.unlink()
    _open_node_error(data_dir)
    oldest.path.write_bytes(saved)  # back from the backup

    async def check() -> None:
        async with pora.open_node(data_dir) as node:
            count = await node.last_entry_id(1) + 1
            assert count > 0
            for entry_id in range(count):
                assert await node.read_entry(1, entry_id) == ENTRY_PAYLOAD

    trio.run(check)
    # a clean stop empties the journal past its last seq
    watermark = read_watermark(data_dir / "journal")
    assert watermark is not None and watermark.state is JournalState.EMPTY
    assert list_segments(data_dir / "journal") == []


async def test_seqs_go_on_past_the_watermark_after_a_clean_stop(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(5, 0, b"a")
        await node.add_entry(6, 0, b"b")
        await node.delete_ledger(6)  # the ledger with the highest durable seq goes
        last_seq = node.statistics().journal.next_seq - 1
    watermark = read_watermark(data_dir / "journal")
    assert watermark == Watermark(JournalState.EMPTY, last_seq + 1)
    async with pora.open_node(data_dir) as node:
        # the new journal starts at the watermark: no seq is given out twice
        assert node.statistics().journal.next_seq == last_seq + 1
        assert read_watermark(data_dir / "journal") == Watermark(JournalState.HOLDING, last_seq + 1)


def test_a_missing_watermark_is_refused_where_the_data_dir_keeps_one(
    data_dir: Path, capsys: Capsys
) -> None:
    _abandoned_journal(data_dir, 2)
    (data_dir / "journal" / WATERMARK_NAME).unlink()
    with pytest.RaisesGroup(JournalFormatError, allow_unwrapped=True, flatten_subgroups=True):
        trio.run(lambda: _open_twice(data_dir))
    result = run_cli(capsys, "journal", "verify", "--json", "--data-dir", str(data_dir))
    assert result.status == 1
    assert "the journal watermark is missing" in result.json()["problem"]["reason"]


async def _open_twice(data_dir: Path) -> None:
    async with pora.open_node(data_dir):
        pass


def test_a_version_5_data_dir_without_a_watermark_opens_and_gets_one(data_dir: Path) -> None:
    trio.run(lambda: write_and_abandon(data_dir, 2, trim_first=False))
    (data_dir / "journal" / WATERMARK_NAME).unlink()
    marker = data_dir / MARKER_NAME
    info = json.loads(marker.read_text())
    marker.write_text(json.dumps({**info, "version": 5}))

    async def check() -> None:
        async with pora.open_node(data_dir) as node:
            assert await node.read_entry(1, 0) == ENTRY_PAYLOAD

    trio.run(check)
    assert json.loads(marker.read_text())["version"] == 6
    watermark = read_watermark(data_dir / "journal")
    assert watermark is not None and watermark.state is JournalState.EMPTY


def test_a_damaged_watermark_is_refused_by_name(tmp_path: Path) -> None:
    write_watermark(tmp_path, Watermark(JournalState.HOLDING, 77))
    path = tmp_path / WATERMARK_NAME
    data = bytearray(path.read_bytes())
    assert decode_watermark(path, bytes(data)) == Watermark(JournalState.HOLDING, 77)
    data[12] ^= 0x01  # a bit of first_seq
    with pytest.raises(JournalFormatError, match="the file is damaged") as caught:
        decode_watermark(path, bytes(data))
    assert caught.value.path == path
    with pytest.raises(JournalFormatError, match="has 24 bytes, this file 3"):
        decode_watermark(path, b"abc")
    assert len(encode_watermark(Watermark(JournalState.EMPTY, 0))) == 24


def test_recover_accepts_a_gap_only_when_told(data_dir: Path, capsys: Capsys) -> None:
    oldest, newest = _abandoned_journal(data_dir, 2)
    oldest.path.unlink()
    assert run_cli(capsys, "recover", "--data-dir", str(data_dir)).status == 1
    accepted = run_cli(
        capsys, "recover", "--accept-journal-gap", "--json", "--data-dir", str(data_dir)
    )
    assert accepted.status == 0
    (gap,) = accepted.json()["gaps_accepted"]
    assert f"seqs {oldest.first_seq}-{newest.first_seq - 1} are in no segment" in gap
    # the node is whole again from what was left: it opens, and the journal checks out
    assert run_cli(capsys, "journal", "verify", "--data-dir", str(data_dir)).status == 0

    async def check() -> None:
        async with pora.open_node(data_dir) as node:
            assert await node.read_entry(1, 0) == ENTRY_PAYLOAD  # flushed before the trim

    trio.run(check)


def test_recover_accepts_a_missing_watermark_when_told(data_dir: Path, capsys: Capsys) -> None:
    _abandoned_journal(data_dir, 2)
    (data_dir / "journal" / WATERMARK_NAME).unlink()
    assert run_cli(capsys, "recover", "--data-dir", str(data_dir)).status == 1
    accepted = run_cli(capsys, "recover", "--accept-journal-gap", "--data-dir", str(data_dir))
    assert accepted.status == 0
    assert "GAP ACCEPTED" in accepted.out and "the journal watermark is missing" in accepted.out
    watermark = read_watermark(data_dir / "journal")
    assert watermark is not None and watermark.state is JournalState.EMPTY
