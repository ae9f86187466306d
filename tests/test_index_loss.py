"""A lost or damaged index never costs an entry: the node refuses to start on entry
logs it cannot locate (rather than start empty and write over them), LevelDB is not
allowed to drop a damaged log file, the inspection commands leave the index byte for
byte as it was, and `pora verify --rebuild-index` brings every entry back."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import plyvel
import pytest
import trio
from cli_support import (
    CLOSED_LEDGER,
    ENTRIES_PER_LEDGER,
    FENCED_LEDGER,
    OPEN_LEDGER,
    SEAL_AT,
    SEALED_LEDGER,
    make_data_dir,
    payload,
    run_cli,
)

import pora
from journal.format import RecordKind
from journal.reader import JournalScanner
from ledger.entrylog import EntryLog
from ledger.entrylog_format import FIRST_RECORD_OFFSET
from ledger.index import Index, IndexDamaged
from pora.node.datadir import IndexMissing

Capsys = pytest.CaptureFixture[str]

_LEDGERS = (OPEN_LEDGER, CLOSED_LEDGER, FENCED_LEDGER, SEALED_LEDGER)


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_data_dir(tmp_path_factory.mktemp("populated") / "pora-data")


@pytest.fixture
def data_dir(populated: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "pora-data"
    shutil.copytree(populated, copy)
    return copy


def hashes(folder: Path) -> dict[str, str]:
    """Every file under `folder`, by relative path, with its SHA-256."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def open_and_close(data_dir: Path) -> None:
    async def run() -> None:
        async with pora.open_node(data_dir):
            pass

    trio.run(run)


def assert_every_entry_readable(data_dir: Path) -> None:
    async def run() -> None:
        async with pora.open_node(data_dir) as node:
            assert sorted(info.ledger_id for info in node.ledgers()) == sorted(_LEDGERS)
            for ledger_id in _LEDGERS:
                last = SEAL_AT if ledger_id == SEALED_LEDGER else ENTRIES_PER_LEDGER - 1
                for entry_id in range(last + 1):
                    got = await node.read_entry(ledger_id, entry_id)
                    assert got == payload(ledger_id, entry_id)

    trio.run(run)


def rebuild(capsys: Capsys, data_dir: Path) -> None:
    result = run_cli(capsys, "verify", "--rebuild-index", "--data-dir", str(data_dir))
    assert result.status == 0, result.out + result.err
    assert run_cli(capsys, "verify", "--data-dir", str(data_dir)).status == 0


def remove_index(data_dir: Path, what: str) -> None:
    if what == "index":
        shutil.rmtree(data_dir / "index")
    elif what == "CURRENT":
        (data_dir / "index" / "CURRENT").unlink()
    else:  # an index LevelDB made afresh, next to the old logs
        shutil.rmtree(data_dir / "index")
        Index(data_dir / "index").close()


def damage_leveldb_log(data_dir: Path) -> Path:
    """Flip a byte in the middle of the index's LevelDB write-ahead log (`.log`)."""
    logs = sorted((data_dir / "index").glob("*.log"))
    assert logs, "the populated index has a LevelDB log file"
    data = bytearray(logs[-1].read_bytes())
    data[len(data) // 2] ^= 0x40
    logs[-1].write_bytes(bytes(data))
    return logs[-1]


# --- a lost index ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "said"),
    [("index", "is missing"), ("CURRENT", "no LevelDB CURRENT"), ("fresh", "holds no ledger")],
)
def test_node_refuses_entry_logs_without_an_index_and_rebuild_restores_them(
    data_dir: Path, capsys: Capsys, what: str, said: str
) -> None:
    remove_index(data_dir, what)
    logs_before = hashes(data_dir / "ledgers")

    with pytest.raises(IndexMissing, match=said) as refused:
        open_and_close(data_dir)
    assert "pora verify --rebuild-index" in str(refused.value)
    assert "4 entry logs" in str(refused.value)
    assert hashes(data_dir / "ledgers") == logs_before

    rebuild(capsys, data_dir)
    assert_every_entry_readable(data_dir)


def test_serve_refuses_entry_logs_without_an_index_with_exit_status_2(data_dir: Path) -> None:
    shutil.rmtree(data_dir / "index")
    logs_before = hashes(data_dir / "ledgers")
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
         "--listen", "127.0.0.1:0", "--log-format", "logfmt"],
        capture_output=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert b"cannot serve" in result.stderr
    assert b"pora verify --rebuild-index" in result.stderr
    assert b"Traceback" not in result.stderr
    assert hashes(data_dir / "ledgers") == logs_before
    assert not (data_dir / "index").exists()  # nothing made in its place


def test_recover_refuses_entry_logs_without_an_index(data_dir: Path, capsys: Capsys) -> None:
    (data_dir / "index" / "CURRENT").unlink()
    before = hashes(data_dir)
    result = run_cli(capsys, "recover", "--data-dir", str(data_dir))
    assert result.status == 1
    assert "pora verify --rebuild-index" in result.err
    assert hashes(data_dir) == before


def test_a_node_with_no_entry_logs_starts_with_a_new_index(tmp_path: Path) -> None:
    open_and_close(tmp_path / "new")
    assert (tmp_path / "new" / "index" / "CURRENT").exists()


def test_an_add_to_a_ledger_the_index_lost_cannot_overwrite_its_log(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the index lost one ledger (its metadata and positions), the others are there:
    # the node starts, and a new add to that ledger id must not re-create its log
    db = plyvel.DB(str(data_dir / "index"), create_if_missing=False)
    try:
        for key in list(db.iterator(include_value=False)):
            if key[1:9] == OPEN_LEDGER.to_bytes(8, "big"):
                db.delete(key, sync=True)
    finally:
        db.close()
    log = data_dir / "ledgers" / f"{OPEN_LEDGER:02x}" / f"{OPEN_LEDGER:016x}.log"
    before = log.read_bytes()

    async def add() -> None:
        async with pora.open_node(data_dir) as node:
            await node.add_entry(OPEN_LEDGER, 0, b"not what entry 0 was", master_key=b"any")

    # the add is acknowledged (journalled), its flush refused: the close says so and
    # keeps the journal, which holds the add
    with pytest.raises(pora.FlushFailed) as refused:
        trio.run(add)
    assert refused.value.ledger_ids == [OPEN_LEDGER]
    assert "refusing to overwrite it" in str(refused.value)
    assert log.read_bytes() == before
    assert "pora verify --rebuild-index" in caplog.text


@pytest.mark.slow
def test_a_crash_in_a_new_nodes_first_flush_is_replayed_not_refused(tmp_path: Path) -> None:
    # the first flush created the log and wrote and synced its records; the crash
    # came before its index batch: an empty index, one entry log, the journal
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    ledger_id, count = 5, 4

    async def write_then_copy() -> None:
        async with pora.open_node(live, flush_interval_ms=3_600_000.0) as node:
            for entry_id in range(count):
                await node.add_entry(ledger_id, entry_id, payload(ledger_id, entry_id))
            shutil.copytree(live, crashed)  # idle: what a SIGKILL now would leave

    trio.run(write_then_copy)
    bodies = [
        record.body
        for batch in JournalScanner(crashed / "journal").batches()
        for record in batch
        if record.kind is RecordKind.ENTRY
    ]
    log_path = crashed / "ledgers" / f"{ledger_id:02x}" / f"{ledger_id:016x}.log"
    with EntryLog.create(log_path, ledger_id, prealloc_chunk_bytes=1 << 20) as log:
        log.write_bodies(bodies, FIRST_RECORD_OFFSET)
        log.sync()

    async def read_back() -> None:
        async with pora.open_node(crashed) as node:
            for entry_id in range(count):
                got = await node.read_entry(ledger_id, entry_id)
                assert got == payload(ledger_id, entry_id)

    trio.run(read_back)
    trio.run(read_back)  # and from the entry log and index, after a clean close


# --- a damaged LevelDB log --------------------------------------------------------------


def test_node_refuses_a_damaged_index_log_rather_than_drop_it(
    data_dir: Path, capsys: Capsys
) -> None:
    damaged = damage_leveldb_log(data_dir)
    evidence = damaged.read_bytes()

    with pytest.raises(IndexDamaged, match="pora verify --rebuild-index"):
        open_and_close(data_dir)
    assert damaged.read_bytes() == evidence  # not dropped, not rewritten

    rebuild(capsys, data_dir)
    assert_every_entry_readable(data_dir)
    # the damaged index is kept aside, its log with it
    kept = list(data_dir.glob("index.damaged-*"))
    assert len(kept) == 1
    assert (kept[0] / damaged.name).read_bytes() == evidence


@pytest.mark.slow
def test_serve_refuses_a_damaged_index_log_with_exit_status_2(data_dir: Path) -> None:
    damage_leveldb_log(data_dir)
    before = hashes(data_dir / "index")
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
         "--listen", "127.0.0.1:0", "--log-format", "logfmt"],
        capture_output=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert b"damaged" in result.stderr
    assert b"pora verify --rebuild-index" in result.stderr
    assert b"Traceback" not in result.stderr
    after = hashes(data_dir / "index")
    # LevelDB's own diary (LOG) and LOCK are all it writes when it refuses
    assert {name: after.get(name) for name in before if name not in ("LOG", "LOCK")} == {
        name: digest for name, digest in before.items() if name not in ("LOG", "LOCK")
    }


_INSPECTIONS = [
    ("verify",),
    ("ledger", "list"),
    ("ledger", "show", str(OPEN_LEDGER)),
    ("ledger", "read", str(OPEN_LEDGER)),
    ("recover", "--dry-run"),
]


@pytest.mark.parametrize("damaged", [False, True], ids=["healthy", "damaged-log"])
@pytest.mark.parametrize("argv", _INSPECTIONS, ids=[" ".join(a) for a in _INSPECTIONS])
def test_inspection_commands_change_no_byte_of_the_index(
    data_dir: Path, capsys: Capsys, argv: tuple[str, ...], damaged: bool
) -> None:
    if damaged:
        damage_leveldb_log(data_dir)
    before = hashes(data_dir / "index")
    result = run_cli(capsys, *argv, "--data-dir", str(data_dir))
    assert hashes(data_dir / "index") == before
    assert sorted(path.name for path in data_dir.iterdir()) == sorted(
        ["PORA", "LOCK", "journal", "ledgers", "index"]
    )  # no copy left behind
    if damaged:
        assert result.status == 1
        assert "damaged" in result.err
        assert "pora verify --rebuild-index" in result.err
    else:
        assert result.status == 0, result.err


# --- damage in the index, not in the entry log -------------------------------------------


def test_a_flipped_byte_in_an_index_table_is_index_damage_and_rebuild_fixes_it(
    data_dir: Path, capsys: Capsys
) -> None:
    db = plyvel.DB(str(data_dir / "index"), create_if_missing=False)
    try:
        db.compact_range()  # move the index from LevelDB's log into a table file
    finally:
        db.close()
    tables = sorted((data_dir / "index").glob("*.ldb"))
    assert tables
    data = bytearray(tables[0].read_bytes())
    data[0] ^= 0x01  # in the first data block: positions or metadata
    tables[0].write_bytes(bytes(data))
    logs_before = hashes(data_dir / "ledgers")
    index_before = hashes(data_dir / "index")

    result = run_cli(capsys, "verify", "--data-dir", str(data_dir))
    assert result.status == 1
    assert f"its table {tables[0]} fails at byte 0: block checksum mismatch" in result.err
    assert "pora verify --rebuild-index" in result.err
    assert "bad-record" not in result.out + result.err
    listed = run_cli(capsys, "ledger", "list", "--data-dir", str(data_dir))
    assert listed.status == 1  # not a silently short list
    assert "damaged" in listed.err
    assert hashes(data_dir / "index") == index_before

    rebuild(capsys, data_dir)
    assert hashes(data_dir / "ledgers") == logs_before
    assert_every_entry_readable(data_dir)


def test_a_wrong_position_is_index_damage_naming_where_the_entry_is_intact(
    data_dir: Path, capsys: Capsys
) -> None:
    # what a damaged index that still passes its checksums says: entry 3 is where
    # entry 4 is
    with Index(data_dir / "index", create=False) as index:
        real = index.get_position(OPEN_LEDGER, 3)
        wrong = index.get_position(OPEN_LEDGER, 4)
        meta = index.get_meta(OPEN_LEDGER)
        assert real is not None and wrong is not None and meta is not None
        index.apply_flush(OPEN_LEDGER, [(3, *wrong)], meta, sync=True)
    log = data_dir / "ledgers" / f"{OPEN_LEDGER:02x}" / f"{OPEN_LEDGER:016x}.log"

    result = run_cli(capsys, "verify", "--json", "--data-dir", str(data_dir))

    assert result.status == 1
    problems = result.json()["problems"]
    # not a bad record, not an unindexed one: the log is intact (the wrong length the
    # index gives entry 3 shows in the ledger's payload bytes too)
    assert [(p["kind"], p["ledger_id"], p["entry_id"], p["offset"]) for p in problems] == [
        ("index-damaged", OPEN_LEDGER, 3, real[0]),
        ("metadata-mismatch", OPEN_LEDGER, None, None),
    ], problems
    assert problems[0]["message"].startswith(
        f"index damaged: ledger {OPEN_LEDGER} entry 3 is intact in {log} at byte {real[0]}"
    )
    assert "pora verify --rebuild-index" in problems[0]["message"]
    rebuild(capsys, data_dir)
    assert_every_entry_readable(data_dir)
