"""Replication against real processes: a 5-node `pora cluster` (SQLite or ZooKeeper
metadata), a writer process (tests/replication_writer_process.py, asyncio, many tasks,
E=3 Qw=3 Qa=2) that logs every acknowledgement, and SIGKILL / SIGSTOP on the nodes and
the writer. What a writer was told is durable must be in the recovered ledger, byte for
byte, on the replicas that hold it; a fenced writer is never told anything more."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from test_cli_cluster import cluster, serve_processes
from waiting import wait_until, wait_until_true
from zookeeper_support import fresh_zk_url

import pora
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import decode_entry
from pora.client.replication.core.quorum import entry_write_set
from pora.meta.backends import open_metadata
from pora.meta.records import LedgerMetadata, LedgerState

WRITER_SCRIPT = Path(__file__).with_name("replication_writer_process.py")
NODES = 5
WRITER_TASKS = 64
PASSWORD = "pw"
ACK_QUORUM = 2
#: acknowledgements the writer logs before a fault, and again after one
ACKS_BETWEEN_FAULTS = 300
WAIT_S = 60.0


@dataclass
class WriterLog:
    """What the writer process logged, complete lines only (a SIGKILL may cut one)."""

    ledger_id: int | None = None
    acks: dict[int, str] = field(default_factory=dict)  # entry id -> payload sha256
    ack_order: list[int] = field(default_factory=list)
    fenced_pending: int = 0
    fenced_later: int = 0
    errors: list[str] = field(default_factory=list)
    done: bool = False
    idle: bool = False


def read_log(path: Path) -> WriterLog:
    text = path.read_text(encoding="ascii") if path.exists() else ""
    parsed = WriterLog()
    for line in text.split("\n")[:-1]:  # the part after the last newline is cut
        words = line.split(" ")
        if words[0] == "ledger":
            parsed.ledger_id = int(words[1])
        elif words[0] == "ack":
            entry_id = int(words[1])
            assert entry_id not in parsed.acks, f"entry {entry_id} acknowledged twice"
            parsed.acks[entry_id] = words[2]
            parsed.ack_order.append(entry_id)
        elif words[:2] == ["fenced", "pending"]:
            parsed.fenced_pending += 1
        elif words[:2] == ["fenced", "later"]:
            parsed.fenced_later += 1
        elif words[0] == "done":
            parsed.done = True
        elif words[0] == "idle":
            parsed.idle = True
        else:
            parsed.errors.append(line)
    return parsed


@asynccontextmanager
async def writer_process(
    url: str, log_path: Path, command: list[str] | None = None
) -> AsyncIterator[trio.Process]:
    """The writer process (`command`, by default WRITER_TASKS tasks at E=3 Qw=3 Qa=2)."""
    command = command or [sys.executable, str(WRITER_SCRIPT), url, str(log_path), str(WRITER_TASKS)]
    process = await trio.lowlevel.open_process(command, env=os.environ)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        await process.wait()


async def wait_for_acks(log_path: Path, count: int, writer: trio.Process) -> WriterLog:
    """The log once it holds `count` acknowledgements (the writer must stay alive)."""

    def enough() -> bool:
        assert writer.poll() is None, f"the writer exited: {read_log(log_path)}"
        return len(read_log(log_path).acks) >= count

    await wait_until(enough, WAIT_S)
    written = read_log(log_path)
    assert written.errors == []
    return written


def node_pids_by_address(folder: Path) -> dict[str, int]:
    """Listen address -> pid of the `pora serve` processes on this cluster's data dirs."""
    return {
        args[args.index(b"--listen") + 1].decode(): pid
        for pid, args in serve_processes(folder).items()
        if b"--listen" in args
    }


async def ledger_record(url: str, ledger_id: int) -> LedgerMetadata:
    async with open_metadata(url) as store:
        return (await store.read_ledger(ledger_id)).value


async def recover(
    url: str, ledger_id: int, config: ClientConfig | None = None
) -> tuple[LedgerMetadata, dict[int, bytes]]:
    """Open the ledger with recovery (fence, recover the tail, close) from this process;
    its closed record and every entry read back through the reader."""
    async with pora.connect(url, config) as client:
        reader = await client.open_ledger(ledger_id, password=PASSWORD)
        entries = {
            entry_id: payload
            async for entry_id, payload in reader.read_entries(0, reader.last_entry_id)
        }
        record = await ledger_record(url, ledger_id)
    assert record.state is LedgerState.CLOSED
    assert record.last_entry_id == reader.last_entry_id
    assert sorted(entries) == list(range(record.last_entry_id + 1))
    return record, entries


async def stored_on(
    address: str, ledger_id: int, last_entry_id: int, token: int = 0
) -> dict[int, bytes]:
    """Every entry of the ledger one node stores up to `last_entry_id`, read directly
    from that node (range reads), as the payloads the replicated entries carry."""
    found: dict[int, bytes] = {}
    first = 0
    async with pora.connect_node(address) as node:
        while first <= last_entry_id:
            page = await node.read_range(ledger_id, first, last_entry_id)
            if not page:
                break
            for entry_id, data in page:
                found[entry_id] = decode_entry(ledger_id, entry_id, data, token=token).payload
            first = page[-1][0] + 1
    return found


async def check_replicas(
    record: LedgerMetadata, recovered: dict[int, bytes], acks: dict[int, str], dead: set[str]
) -> None:
    """Every acknowledged entry is in the recovered ledger with the acknowledged bytes;
    every live replica of every recovered entry's write set that holds it holds the same
    bytes; and the live members hold each entry at least as often as the quorums promise
    (Qa copies less the members of its write set that were killed)."""
    ledger_id = record.ledger_id
    for entry_id, digest in acks.items():
        assert entry_id <= record.last_entry_id, f"acknowledged {entry_id} was cut"
        assert hashlib.sha256(recovered[entry_id]).hexdigest() == digest, entry_id
    members = {m.address for ensemble in record.ensembles for m in ensemble.members}
    replicas: dict[str, dict[int, bytes]] = {}
    for address in sorted(members - dead):
        replicas[address] = await stored_on(address, ledger_id, record.last_entry_id, record.token)
    for entry_id, payload in recovered.items():
        write_set = {m.address for m in entry_write_set(record, entry_id)}
        holders = [a for a in write_set - dead if entry_id in replicas[a]]
        for address in holders:
            assert replicas[address][entry_id] == payload, (entry_id, address)
        expected = max(1, ACK_QUORUM - len(write_set & dead))
        assert len(holders) >= expected, (entry_id, sorted(write_set), holders)


async def a_member_after_acks(url: str, log_path: Path, writer: trio.Process) -> tuple[int, str]:
    """Once the writer logged ACKS_BETWEEN_FAULTS acknowledgements: its ledger id, and
    the address of a member of its ensemble (the second) to fail."""
    before = await wait_for_acks(log_path, ACKS_BETWEEN_FAULTS, writer)
    assert before.ledger_id is not None
    first = await ledger_record(url, before.ledger_id)
    assert len(first.ensembles) == 1
    return before.ledger_id, first.ensembles[-1].members[1].address


async def writes_past_an_ensemble_change(
    url: str, ledger_id: int, victim: str, log_path: Path, writer: trio.Process
) -> LedgerMetadata:
    """Once the record names a new ensemble without `victim`, wait for the writer's
    log to grow on it; the changed record."""

    async def ensemble_changed() -> bool:
        return len((await ledger_record(url, ledger_id)).ensembles) >= 2

    await wait_until_true(ensemble_changed, WAIT_S)
    changed = await ledger_record(url, ledger_id)
    assert victim not in {m.address for m in changed.ensembles[-1].members}
    # writes go on past the change: the log keeps growing on the new ensemble (the
    # ids acknowledged are distinct, so this many reach past its first)
    on_new_ensemble = changed.ensembles[-1].first_entry_id + ACKS_BETWEEN_FAULTS
    after = await wait_for_acks(log_path, on_new_ensemble + 1, writer)
    assert max(after.acks) >= on_new_ensemble
    return changed


async def recovered_with_every_ack(
    url: str, ledger_id: int, log_path: Path, dead: set[str]
) -> LedgerMetadata:
    """Recover the ledger of the killed writer's log (which holds no failure) and check
    every acknowledged entry, the nodes at `dead` left out; the closed record."""
    written = read_log(log_path)
    assert written.errors == [] and written.fenced_pending == 0
    record, recovered = await recover(url, ledger_id)
    assert record.last_entry_id >= max(written.acks)
    await check_replicas(record, recovered, written.acks, dead)
    return record


async def node_killed_mid_write_then_writer_killed(tmp_path: Path, metadata: str | None) -> None:
    async with cluster(tmp_path, NODES, metadata) as running:
        url = (await running.wait_for_line("metadata URL: ")).split(": ", 1)[1]
        await running.wait_for_line(f"ready: {NODES} nodes")
        log_path = tmp_path / "writer.log"
        async with writer_process(url, log_path) as writer:
            ledger_id, victim = await a_member_after_acks(url, log_path, writer)
            os.kill(node_pids_by_address(running.folder)[victim], signal.SIGKILL)
            await writes_past_an_ensemble_change(url, ledger_id, victim, log_path, writer)
            writer.kill()
            await writer.wait()
        record = await recovered_with_every_ack(url, ledger_id, log_path, {victim})
        assert len(record.ensembles) >= 2


@pytest.mark.slow
async def test_a_node_killed_mid_write_then_the_writer_killed_loses_no_acknowledged_entry(
    tmp_path: Path,
) -> None:
    await node_killed_mid_write_then_writer_killed(tmp_path, None)


@pytest.mark.slow
async def test_a_node_killed_mid_write_on_zookeeper_metadata(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    await node_killed_mid_write_then_writer_killed(tmp_path, fresh_zk_url(request))


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat ("T": stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


async def zombie_writer_stopped_during_a_recovery(tmp_path: Path, metadata: str | None) -> None:
    async with cluster(tmp_path, NODES, metadata) as running:
        url = (await running.wait_for_line("metadata URL: ")).split(": ", 1)[1]
        await running.wait_for_line(f"ready: {NODES} nodes")
        log_path = tmp_path / "writer.log"
        async with writer_process(url, log_path) as writer:
            await wait_for_acks(log_path, ACKS_BETWEEN_FAULTS, writer)
            writer.send_signal(signal.SIGSTOP)
            await wait_until(lambda: process_state(writer.pid) == "T", WAIT_S)
            at_stop = read_log(log_path)
            assert at_stop.ledger_id is not None
            ledger_id = at_stop.ledger_id

            # another process's recovery fences the ledger and closes it while the
            # writer is stopped with appends in flight
            record, recovered = await recover(url, ledger_id)
            assert record.last_entry_id >= max(at_stop.acks)

            writer.send_signal(signal.SIGCONT)
            with trio.fail_after(WAIT_S):
                assert await writer.wait() == 0
        final = read_log(log_path)
        assert final.errors == [] and final.done
        # every task's pending append, and the one it tried after, failed LedgerFenced
        assert (final.fenced_pending, final.fenced_later) == (WRITER_TASKS, WRITER_TASKS)
        # an acknowledgement logged after SIGCONT is one the nodes sent before they were
        # fenced (it sat in the writer's sockets): the recovery kept it (check_replicas);
        # nothing the recovery cut was acknowledged
        late = final.ack_order[len(at_stop.ack_order) :]
        assert all(entry_id <= record.last_entry_id for entry_id in late), late
        await check_replicas(record, recovered, final.acks, dead=set())
        # the closed ledger never moves once closed
        assert await ledger_record(url, ledger_id) == record


@pytest.mark.slow
async def test_a_zombie_writer_stopped_during_a_recovery_is_fenced_and_told_nothing_more(
    tmp_path: Path,
) -> None:
    await zombie_writer_stopped_during_a_recovery(tmp_path, None)


@pytest.mark.slow
async def test_a_zombie_writer_on_zookeeper_metadata(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    await zombie_writer_stopped_during_a_recovery(tmp_path, fresh_zk_url(request))
