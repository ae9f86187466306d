"""A fence survives its node's data dir being put back from a copy (R27), against
real `pora serve` processes: three nodes, a writer process appending (E=3 Qw=3
Qa=2); a member B, whose lease is long so that no renewal raises its mark during
the test, frozen (SIGSTOP) for its data dir to be copied whole, resumed; a
recovering client fences the ledger on B (B answers); B SIGKILLed at once, put
back from the copy (which lacks the fence) and restarted at its address. B must
start as a new instance: the fence's mark write put the copy behind its mark, so
the old writer's adds, which name the old instance, are refused there."""

from __future__ import annotations

import contextlib
import shutil
import signal
from pathlib import Path

import pytest
from test_node_copy_mid_write_processes import put_back_as_a_new_instance
from test_node_registration import serve, stop
from test_replication_processes import ledger_record, wait_for_acks, writer_process

import pora
from netio.errors import InstanceMismatch
from netio.security import master_key_from_password
from pora.meta.backends import open_metadata
from pora.node.datadir import open_data_dir

#: B's lease: its first renewal (a third of it) comes long after the test is done
LONG_LEASE_S = 600.0
#: acknowledgements before the copy, and between the copy and the fence
ACKS_BEFORE_COPY = 50
ACKS_AFTER_COPY = 100
PASSWORD = "pw"  # the writer process's


@pytest.mark.slow
async def test_a_fence_taken_after_a_copy_puts_the_copy_behind_the_mark(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    copy = tmp_path / "copy"
    async with contextlib.AsyncExitStack() as nodes:
        for name in ("a", "c"):
            await nodes.enter_async_context(serve(tmp_path / name, tmp_path, url))
        data_dir = tmp_path / "b"
        b = await nodes.enter_async_context(
            serve(data_dir, tmp_path, url, "--registration-lease-s", str(LONG_LEASE_S))
        )
        old = open_data_dir(data_dir, create=False).instance_id
        async with open_metadata(url) as store:
            start_mark = await store.node_mark(old)
        log_path = tmp_path / "writer.log"
        async with writer_process(url, log_path) as writer:
            before = await wait_for_acks(log_path, ACKS_BEFORE_COPY, writer)
            assert before.ledger_id is not None
            ledger_id = before.ledger_id
            members = (await ledger_record(url, ledger_id)).ensembles[-1].members
            assert b.address in {m.address for m in members}

            # a consistent copy while the ledger is written: B frozen meanwhile
            b.process.send_signal(signal.SIGSTOP)
            try:
                shutil.copytree(data_dir, copy)
            finally:
                b.process.send_signal(signal.SIGCONT)
            # B journals past the copy (the copy alone is not behind any mark)
            await wait_for_acks(log_path, ACKS_BEFORE_COPY + ACKS_AFTER_COPY, writer)
            async with open_metadata(url) as store:
                assert await store.node_mark(old) == start_mark  # no renewal came

            # a recovering client fences the ledger on B, which answers
            async with pora.connect_node(b.address) as node_client:
                await node_client.fence_ledger(ledger_id, password=PASSWORD, timeout_s=30)
            # B killed at once: no renewal, no clean stop writes its mark
            assert await stop(b, signal.SIGKILL) == -signal.SIGKILL
            writer.kill()
            await writer.wait()

        async with open_metadata(url) as store:
            mark = await store.node_mark(old)
            assert mark is not None and start_mark is not None and mark > start_mark
            # the old registration stands for its lease, long here: it ran out
            await store.unregister_node(b.address, old)
        again = await put_back_as_a_new_instance(nodes, copy, data_dir, url, b.address)

        # the old writer's adds name the old instance: B refuses them, fenced or not
        async with pora.connect_node(again.address) as node_client:
            with pytest.raises(InstanceMismatch):
                await node_client.add_coalesced(
                    ledger_id,
                    [(max(before.acks) + 10_000, b"zombie")],
                    master_key=master_key_from_password(PASSWORD),
                    instance_id=old,
                )
