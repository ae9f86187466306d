"""A node put back from an older copy of its data dir, with real `pora serve`
processes (R27): E=3 Qw=3 Qa=2 on A, B, C; B's data dir copied before the ledger
exists; C stopped after about 100 acknowledgements, so the later ones are A's and B's;
the writer SIGKILLed; B stopped, put back from the copy and restarted. B finds itself behind
its instance's mark and starts as a new instance, so a recovery with A stopped cannot
take B's "no such entry" for the old instance's: it fails instead of closing the
ledger short, and once A is back a recovery closes it with every acknowledged entry."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import signal
from pathlib import Path

import pytest
import trio
from test_node_registration import nodes_in, serve, stop
from test_replication_processes import read_log, wait_for_acks, writer_process

import pora
from pora.client.replication.config import ClientConfig
from pora.meta.backends import open_metadata
from pora.meta.records import LedgerState
from pora.node.datadir import open_data_dir

#: acknowledgements before C is stopped, and after (all on A and B)
BEFORE_C_STOPS = 100
AFTER_C_STOPS = 1000
WAIT_S = 60.0
PASSWORD = "pw"


@pytest.mark.slow
async def test_a_node_put_back_from_an_old_copy_never_makes_a_recovery_lose_entries(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    copy = tmp_path / "b-copy"
    async with serve(tmp_path / "b", tmp_path, url) as b:
        b_address = b.address
        old_b = open_data_dir(tmp_path / "b", create=False).instance_id
        assert await stop(b) == 0
    shutil.copytree(tmp_path / "b", copy)  # before the ledger exists
    async with (
        contextlib.AsyncExitStack() as later,  # B restarted from the copy, left last
        serve(tmp_path / "a", tmp_path, url) as a,
        serve(tmp_path / "c", tmp_path, url) as c,
    ):
        b = await later.enter_async_context(
            serve(tmp_path / "b", tmp_path, url, "--listen", b_address)
        )
        log_path = tmp_path / "writer.log"
        async with writer_process(url, log_path) as writer:
            await wait_for_acks(log_path, BEFORE_C_STOPS, writer)
            c.process.send_signal(signal.SIGSTOP)
            try:
                before = len(read_log(log_path).acks)
                await wait_for_acks(log_path, before + AFTER_C_STOPS, writer)
                writer.kill()
                await writer.wait()
            finally:
                c.process.send_signal(signal.SIGCONT)
        written = read_log(log_path)
        assert written.errors == [] and written.ledger_id is not None
        ledger_id = written.ledger_id
        async with open_metadata(url) as store:
            record = (await store.read_ledger(ledger_id)).value
            assert len(record.ensembles) == 1  # C was slow, not failed: A and B acked
            assert {m.address for m in record.ensembles[0].members} == {
                a.address,
                b_address,
                c.address,
            }

        # B is stopped and put back from the copy (same instance id on disk). A node
        # SIGKILLed within a mark interval of its last acknowledgement would not be
        # caught (R27): B stops as an operator restoring a backup stops it
        assert await stop(b) == 0
        shutil.rmtree(tmp_path / "b")
        shutil.move(copy, tmp_path / "b")
        assert open_data_dir(tmp_path / "b", create=False).instance_id == old_b
        b = await later.enter_async_context(
            serve(tmp_path / "b", tmp_path, url, "--listen", b_address)
        )

        # A stopped (slow, not failed): B's answers are not the old instance's, C's
        # "no such entry" alone decides nothing: the recovery fails, closes nothing
        config = ClientConfig(node_timeout_s=1.0, recovery_attempts_max=2)
        a.process.send_signal(signal.SIGSTOP)
        try:
            async with pora.connect(url, config) as client:
                with trio.fail_after(WAIT_S):
                    try:
                        short = await client.open_ledger(ledger_id, password=PASSWORD)
                    except pora.RecoveryFailed:
                        short = None
                assert short is None, (
                    f"recovered with A stopped: closed at {short.last_entry_id} with "
                    f"{max(written.acks)} acknowledged"
                )
            async with open_metadata(url) as store:
                assert (await store.read_ledger(ledger_id)).value.state is not LedgerState.CLOSED
        finally:
            a.process.send_signal(signal.SIGCONT)

        # A back: the recovery closes the ledger with every acknowledged entry
        async with pora.connect(url) as client:
            with trio.fail_after(WAIT_S):
                reader = await client.open_ledger(ledger_id, password=PASSWORD)
            assert reader.last_entry_id >= max(written.acks)
            entries = {
                entry_id: payload
                async for entry_id, payload in reader.read_entries(0, max(written.acks))
            }
        for entry_id, digest in written.acks.items():
            assert hashlib.sha256(entries[entry_id]).hexdigest() == digest, entry_id

        # what the operator sees: B serves as a new instance, and says why
        new_b = open_data_dir(tmp_path / "b", create=False).instance_id
        assert new_b != old_b
        log = b.log_path.read_text()
        assert f"is behind what node instance {old_b} acknowledged" in log
        assert f"the new instance {new_b}" in log
        assert (await nodes_in(url))[b_address].instance_id == new_b
        async with open_metadata(url) as store:
            assert await store.node_mark(old_b) is not None  # kept: a second put-back is caught
            assert await store.node_mark(new_b) is not None
