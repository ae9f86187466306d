"""A node put back from a copy of its data dir taken while a ledger on it was being
written, against real `pora serve` processes (R27's marks written with the lease
renewals, not at a clean stop): four nodes, a writer process (E=3 Qw=3 Qa=2, 64
tasks); a member B frozen (SIGSTOP) for its data dir to be copied whole, resumed;
once B's mark moved past the copy, B SIGKILLed, put back from the copy and restarted
at its address. B starts as a new instance; the writer, still appending, fails the
old member and goes on; a recovery after the writer is killed holds every
acknowledged entry, none read from B's copy in place of the old instance's."""

from __future__ import annotations

import contextlib
import shutil
import signal
from pathlib import Path

import pytest
from test_node_registration import LEASE_S, Node, nodes_in, serve, stop
from test_replication_processes import (
    ACKS_BETWEEN_FAULTS,
    WAIT_S,
    ledger_record,
    read_log,
    recovered_with_every_ack,
    wait_for_acks,
    writer_process,
)
from waiting import wait_until_true

from pora.meta.backends import open_metadata
from pora.node.datadir import open_data_dir


@pytest.mark.slow
async def test_a_node_put_back_from_a_copy_taken_mid_write_is_a_new_instance(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    copy = tmp_path / "copy"
    async with contextlib.AsyncExitStack() as nodes:
        served = {
            name: await nodes.enter_async_context(serve(tmp_path / name, tmp_path, url))
            for name in ("a", "b", "c", "d")
        }
        log_path = tmp_path / "writer.log"
        async with writer_process(url, log_path) as writer:
            before = await wait_for_acks(log_path, ACKS_BETWEEN_FAULTS, writer)
            assert before.ledger_id is not None
            ledger_id = before.ledger_id
            members = (await ledger_record(url, ledger_id)).ensembles[-1].members
            name = next(n for n, node in served.items() if node.address == members[1].address)
            b, data_dir = served[name], tmp_path / name
            old = open_data_dir(data_dir, create=False).instance_id

            # a consistent copy while the ledger is written: B frozen meanwhile
            b.process.send_signal(signal.SIGSTOP)
            try:
                shutil.copytree(data_dir, copy)
            finally:
                b.process.send_signal(signal.SIGCONT)
            async with open_metadata(url) as store:
                marks = [await store.node_mark(old)]

                async def mark_moved_twice() -> bool:
                    # twice: a renewal under way during the copy may carry an older seq
                    mark = await store.node_mark(old)
                    if mark != marks[-1]:
                        marks.append(mark)
                    return len(marks) >= 3

                await wait_until_true(mark_moved_twice, WAIT_S)

            # B killed (no clean stop writes its mark), put back from the copy
            assert await stop(b, signal.SIGKILL) == -signal.SIGKILL
            await put_back_as_a_new_instance(nodes, copy, data_dir, url, b.address)

            # the writer goes on without the old instance
            at_restart = len(read_log(log_path).acks)
            await wait_for_acks(log_path, at_restart + ACKS_BETWEEN_FAULTS, writer)
            record = await ledger_record(url, ledger_id)
            assert members[1] not in record.ensembles[-1].members
            writer.kill()
            await writer.wait()
        # B's copy counts for nothing the old instance held (R19, R24)
        await recovered_with_every_ack(url, ledger_id, log_path, {b.address})


async def put_back_as_a_new_instance(
    nodes: contextlib.AsyncExitStack, copy: Path, data_dir: Path, url: str, address: str
) -> Node:
    """Put the killed node's data dir back from `copy` and serve it again at `address`
    (the node, kept in `nodes`): it must start as a new instance, and say why. Waits
    for the killed instance's registration to run out first: until then the address
    is the old instance's, and a new one is refused it."""
    old = open_data_dir(copy, create=False).instance_id

    async def address_free() -> bool:
        return address not in await nodes_in(url)

    await wait_until_true(address_free, LEASE_S * 20)
    shutil.rmtree(data_dir)
    shutil.move(copy, data_dir)
    again = await nodes.enter_async_context(
        serve(data_dir, data_dir.parent, url, "--listen", address)
    )
    assert open_data_dir(data_dir, create=False).instance_id != old
    assert f"is behind what node instance {old} acknowledged" in again.log_path.read_text()
    return again
