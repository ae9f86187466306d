"""The SQLite store's file against the faults of the processes sharing it: another
process frozen (SIGSTOP) while it holds the write lock, a store opened where none was
set up, and the file deleted or replaced under a running process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from cli_support import run_cli
from test_meta_store import ledger

import pora
from pora.meta import (
    MetadataConfig,
    MetadataStore,
    MetadataStoreGone,
    MetadataTimeout,
    MetadataUnavailable,
    NodeRegistration,
    open_metadata,
)

Capsys = pytest.CaptureFixture[str]

#: takes the file's write lock and says so; the test then freezes it
HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE id_blocks SET next_id = next_id WHERE name = 'ledger'")
print("held", flush=True)
time.sleep(600)
"""


def set_up(url: str) -> None:
    """A store set up as a node sets it up, with one ledger and one live node."""

    async def main() -> None:
        async with open_metadata(url, create=True) as store:
            await store.create_ledger(ledger(await store.allocate_ledger_id()))
            await store.register_node(NodeRegistration("127.0.0.1:3181", "inst-a"), 600)

    trio.run(main)


@pytest.fixture
def frozen_writer(tmp_path: Path) -> Iterator[str]:
    """A store whose write lock another process holds, frozen with SIGSTOP."""
    url = f"sqlite://{tmp_path / 'meta.db'}"
    set_up(url)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "meta.db")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        os.kill(holder.pid, signal.SIGSTOP)
        yield url
    finally:
        holder.kill()
        holder.wait()


def test_a_frozen_writer_blocks_no_opening_and_no_read(frozen_writer: str) -> None:
    url = frozen_writer

    async def main() -> None:
        for create in (False, True):  # a schema in place is only read, either way
            with trio.fail_after(5):
                async with open_metadata(url, MetadataConfig(call_timeout_s=2), create=create) as s:
                    assert [n.address for n in await s.list_nodes()] == ["127.0.0.1:3181"]
                    assert (await s.read_ledger(0)).version == 0
                    assert len(await s.list_ledgers()) == 1

    trio.run(main)


def test_a_frozen_writer_lets_clients_connect(frozen_writer: str) -> None:
    async def main() -> None:
        with trio.fail_after(5):
            async with pora.connect(frozen_writer) as client:
                assert [m.ledger_id async for m in client.list_ledgers()] == [0]

    trio.run(main)


def test_a_frozen_writer_lets_the_inspection_commands_run(
    frozen_writer: str, capsys: Capsys
) -> None:
    nodes = run_cli(capsys, "nodes", "--metadata", frozen_writer, "--json")
    assert nodes.status == 0, nodes.err
    assert [n["address"] for n in nodes.json()["nodes"]] == ["127.0.0.1:3181"]
    ledgers = run_cli(capsys, "ledger", "list", "--metadata", frozen_writer, "--json")
    assert ledgers.status == 0, ledgers.err


def test_a_frozen_writer_makes_a_write_time_out_within_the_call_timeout(
    frozen_writer: str,
) -> None:
    async def main() -> None:
        async with open_metadata(frozen_writer, MetadataConfig(call_timeout_s=1)) as store:
            record = await store.read_ledger(0)
            started = time.monotonic()
            with pytest.raises(MetadataTimeout, match="locked") as error:
                await store.update_ledger(record.value.closed(1, 1), record.version)
            assert time.monotonic() - started < 1.5
            assert error.value.url == frozen_writer
            assert "another process holds the write lock" in str(error.value)

    trio.run(main)


# --- a store that was never set up ----------------------------------------------------


def test_an_inspection_command_never_creates_a_store(tmp_path: Path, capsys: Capsys) -> None:
    missing = tmp_path / "x" / "missing.db"
    (tmp_path / "x").mkdir()
    for command in (["nodes"], ["ledger", "list"]):
        result = run_cli(capsys, *command, "--metadata", f"sqlite:{missing}")
        assert result.status == 2
        assert f"no store at {missing}" in result.err
        assert "pora serve --metadata URL" in result.err
        assert list((tmp_path / "x").iterdir()) == []


def test_a_client_never_creates_a_store(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()  # a file, but no store in it: not set up either

    async def main() -> None:
        with pytest.raises(MetadataUnavailable, match=r"no store at .*missing\.db") as error:
            async with pora.connect(f"sqlite://{tmp_path / 'missing.db'}"):
                raise AssertionError("connected")
        assert "pora cluster" in str(error.value)
        with pytest.raises(MetadataUnavailable, match="holds no Pora metadata schema"):
            async with pora.connect(f"sqlite://{empty}"):
                raise AssertionError("connected")

    trio.run(main)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.db"]
    assert empty.stat().st_size == 0


# --- the file removed or replaced under a running process -----------------------------


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _replace(path: Path) -> None:
    os.replace(path.with_name("other.db"), path)  # another store's file, moved in


@pytest.mark.parametrize("fault", [_remove, _replace], ids=["removed", "replaced"])
def test_a_process_stops_writing_to_a_removed_or_replaced_file(
    tmp_path: Path, fault: Callable[[Path], None]
) -> None:
    path = tmp_path / "meta.db"
    url = f"sqlite://{path}"
    set_up(f"sqlite://{tmp_path / 'other.db'}")

    async def main() -> None:
        async with open_metadata(url) as store:
            record = await store.create_ledger(ledger(await store.allocate_ledger_id()))
            fault(path)
            with pytest.raises(MetadataStoreGone) as error:
                await store.update_ledger(record.value.closed(1, 1), record.version)
            assert error.value.url == url
            assert f"the file {path} was" in str(error.value)
            assert "writes nothing more to it" in str(error.value)
            # every later call says the same, reads included
            with pytest.raises(MetadataStoreGone):
                await store.read_ledger(record.value.ledger_id)
            with pytest.raises(MetadataStoreGone):
                await store.renew_node("127.0.0.1:3181", "inst-a")

    trio.run(main)
    if path.exists():  # replaced: the other store's file is untouched
        assert path.stat().st_size > 0


def test_a_read_notices_a_removed_file(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"

    async def main(store: MetadataStore) -> None:
        await store.list_nodes()
        _remove(path)
        with pytest.raises(MetadataStoreGone, match="removed"):
            await store.list_nodes()

    async def opened() -> None:
        async with open_metadata(f"sqlite://{path}") as store:
            await main(store)

    trio.run(opened)
    assert not path.exists()  # nothing re-created it
