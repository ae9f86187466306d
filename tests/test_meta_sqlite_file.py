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
from replication_support import Fault, local_cluster
from serve_helpers import http_get, samples
from test_meta_store import ledger
from test_node_registration import LEASE_S, serve, stop
from waiting import wait_until_true
from writer_support import client_on
from zookeeper_support import fresh_zk_url

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
from pora.server.registration import NodeRegistrar, NodeState

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


async def set_up_store(url: str) -> None:
    """A store set up as a node sets it up, with one ledger and one live node."""
    async with open_metadata(url, create=True) as store:
        await store.create_ledger(ledger(await store.allocate_ledger_id()))
        await store.register_node(NodeRegistration("127.0.0.1:3181", "inst-a"), 600)


def set_up(url: str) -> None:
    trio.run(set_up_store, url)


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
            # the 1 s asked for, not the 10 s default: half the default bounds it, so
            # that a loaded machine's slowness cannot fail the test
            assert time.monotonic() - started < 5
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


def test_zookeeper_clients_and_inspection_never_set_up_a_chroot(
    request: pytest.FixtureRequest, capsys: Capsys
) -> None:
    url = fresh_zk_url(request)
    result = run_cli(capsys, "nodes", "--metadata", url)
    assert result.status == 2
    assert "no store under the chroot" in result.err

    async def main() -> None:
        with pytest.raises(MetadataUnavailable, match="is missing"):
            async with pora.connect(url):
                raise AssertionError("connected")
        async with open_metadata(url, create=True) as store:  # the nodes' path
            assert await store.list_nodes() == []
        async with pora.connect(url) as client:  # now set up: it opens
            assert [m async for m in client.list_ledgers()] == []

    trio.run(main)


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


# --- a writer's record changes on a store that stops taking writes --------------------


def freeze_a_writer(path: Path) -> subprocess.Popen[str]:
    """Another process takes the file's write lock and is frozen (SIGSTOP)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline() == "held\n"
    os.kill(holder.pid, signal.SIGSTOP)
    return holder


async def test_an_ensemble_change_gives_up_when_the_write_lock_stays_held(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path, nodes=4) as cluster,
        client_on(
            cluster,
            metadata=MetadataConfig(call_timeout_s=0.5),
            ensemble_change_timeout_s=2.0,
        ) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await ledger.append_many([b"before"] * 10)
        holder = freeze_a_writer(tmp_path / "meta.db")
        try:
            cluster.set_fault(ledger.metadata.ensembles[-1].members[0].address, Fault.FAIL)
            started = time.monotonic()
            # R10: entries from the change's first wait for it, and it cannot be written
            with trio.fail_after(30), pytest.raises(MetadataTimeout):
                for _ in range(10_000):
                    await ledger.append(b"after")
            assert time.monotonic() - started < 10
        finally:
            holder.kill()
            holder.wait()


async def test_a_close_gives_up_within_the_call_timeout_when_the_write_lock_stays_held(
    tmp_path: Path,
) -> None:
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster, metadata=MetadataConfig(call_timeout_s=0.5)) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await ledger.append_many([b"entry"] * 10)
        holder = freeze_a_writer(tmp_path / "meta.db")
        try:
            started = time.monotonic()
            with trio.fail_after(30), pytest.raises(MetadataTimeout):
                await ledger.close()
            # the 0.5 s asked for, not the 10 s default (bounded generously: a loaded
            # machine's slowness must not fail the test)
            assert time.monotonic() - started < 5
        finally:
            holder.kill()
            holder.wait()
        await ledger.close()  # the lock released: the close is retried and takes
        assert (await cluster.store.read_ledger(ledger.ledger_id)).value.last_entry_id == 9


@pytest.mark.parametrize("fault", [_remove, _replace], ids=["removed", "replaced"])
async def test_a_writer_fails_rather_than_record_in_a_removed_or_replaced_file(
    tmp_path: Path, fault: Callable[[Path], None]
) -> None:
    await set_up_store(f"sqlite://{tmp_path / 'other.db'}")
    async with local_cluster(tmp_path, nodes=4) as cluster, client_on(cluster) as client:
        changing = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        closing = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        await changing.append_many([b"entry"] * 10)
        await closing.append_many([b"entry"] * 10)
        fault(tmp_path / "meta.db")
        # an ensemble change: the writer stops instead of recording the change unseen
        cluster.set_fault(changing.metadata.ensembles[-1].members[0].address, Fault.FAIL)
        with trio.fail_after(30), pytest.raises(MetadataStoreGone, match=r"meta\.db was"):
            for _ in range(10_000):  # entries before the change's first are acknowledged
                await changing.append(b"after")
        with trio.fail_after(30), pytest.raises(MetadataStoreGone, match=r"meta\.db was"):
            await closing.close()


async def test_a_node_stops_renewing_in_a_removed_file_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "meta.db"
    async with open_metadata(f"sqlite://{path}") as store:
        state = NodeState(read_only=False, free_bytes=1 << 30)
        registrar = NodeRegistrar(store, "127.0.0.1:4000", "instance-a", None, 0.3, lambda: state)
        await registrar.register()
        await registrar.tick()
        _remove(path)
        with trio.fail_after(10):
            await registrar.run()  # renews every 0.1 s until it finds the file gone
        assert not registrar.status.registered
        (stopped,) = [r for r in caplog.records if "stops renewing" in r.getMessage()]
        assert stopped.levelname == "ERROR"
        assert f"the file {path} was removed" in stopped.getMessage()
        await registrar.unregister()
    assert not path.exists()


# --- clocks: every process judges leases by its own wall clock ------------------------

HOUR_S = 3600
#: a process whose wall clock is off by argv[2] seconds (as under faketime) registers a
#: node (argv[3]) with a 5 s lease, renews it, and prints the addresses it sees live
SKEWED = """
import sys, time
real = time.time
time.time = lambda: real() + float(sys.argv[2])
import trio
from pora.meta import NodeRegistration, open_metadata

async def main():
    async with open_metadata(sys.argv[1], create=False) as store:
        if sys.argv[3]:
            await store.register_node(NodeRegistration(sys.argv[3], "skewed"), 5.0)
            await store.renew_node(sys.argv[3], "skewed", 5.0)
        print(" ".join(n.address for n in await store.list_nodes()))

trio.run(main)
"""


def skewed_process(url: str, skew_s: float, register: str = "") -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", SKEWED, url, str(skew_s), register],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.split()


def distrusted(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.message for r in caplog.records if "ahead of this process's clock" in r.message]


async def test_a_registration_renewed_from_a_clock_an_hour_ahead_is_not_taken_as_live(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite://{tmp_path / 'meta.db'}"
    async with open_metadata(url) as store:
        # a node a little ahead, within its lease, is trusted
        assert await trio.to_thread.run_sync(skewed_process, url, 2, "127.0.0.1:3182")
        # a node an hour ahead (then killed): not "writable, 0 s ago" for an hour
        assert await trio.to_thread.run_sync(skewed_process, url, HOUR_S, "127.0.0.1:3181")
        assert [n.address for n in await store.list_nodes()] == ["127.0.0.1:3182"]
        (warning,) = distrusted(caplog)
        assert "127.0.0.1:3181 (instance skewed)" in warning
        assert "ahead of this process's clock" in warning
        # and it holds its address for no one: another instance may register there
        await store.register_node(NodeRegistration("127.0.0.1:3181", "honest"), 5.0)
        assert [n.instance_id for n in await store.list_nodes()] == ["honest", "skewed"]


async def test_a_reader_whose_clock_lags_by_more_than_a_lease_trusts_no_renewal(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'meta.db'}"
    async with open_metadata(url) as node:
        await node.register_node(NodeRegistration("127.0.0.1:3181", "inst-a"), 5.0)
        # rather than seeing a killed node live for an hour
        assert await trio.to_thread.run_sync(skewed_process, url, -HOUR_S) == []


@pytest.mark.slow
async def test_a_served_node_stops_renewing_when_its_store_file_is_deleted(
    data_dir: Path, tmp_path: Path
) -> None:
    path = tmp_path / "meta.db"
    url = f"sqlite://{path}"
    async with serve(data_dir, tmp_path, url) as node:
        _remove(path)

        async def said_so() -> bool:
            return "stops renewing its registration" in node.log_path.read_text()

        await wait_until_true(said_so, 30)
        log = node.log_path.read_text()
        assert f"the file {path} was removed since this process opened it" in log
        values = samples((await http_get(node.metrics_port, "/metrics"))[1])
        assert values[f"pora_registered{{metadata={url}}}"] == 0
        assert node.process.poll() is None  # it keeps serving
        await trio.sleep(LEASE_S)  # renewals would have come by now
        assert not path.exists()  # and nothing made a new, empty store there
        assert await stop(node) == 0
