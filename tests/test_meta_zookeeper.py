"""What only the ZooKeeper backend has: its layout, ephemeral registrations bound to a
session (SIGKILL, server restarts, session expiry) and a local server's restarts. The
behaviour both backends share is in test_meta_store.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import pytest
import trio
from kazoo.client import KazooClient
from waiting import wait_until
from zookeeper_support import fresh_zk_url, shared_zookeeper

from pora.meta import (
    Ensemble,
    EnsembleMember,
    LedgerMetadata,
    MetadataConfig,
    MetadataRecordTooLarge,
    MetadataUnavailable,
    NodeAddressTaken,
    NodeRegistration,
    open_metadata,
)
from pora.meta.local_zookeeper import LocalZooKeeper, free_loopback_port
from pora.meta.zk_layout import parse_zk_url
from pora.meta.zk_store import ZooKeeperMetadataStore

#: the shortest session the local server allows is two ticks; a second keeps waits short
SHORT_SESSION = MetadataConfig(session_timeout_s=1.0, call_timeout_s=5.0)
NODE = NodeRegistration("127.0.0.1:3181", "instance-a", free_bytes=7)


def ledger(ledger_id: int, **custom: bytes) -> LedgerMetadata:
    members = tuple(EnsembleMember(f"127.0.0.1:{3181 + k}", f"i{k}") for k in range(3))
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=(Ensemble(0, members),),
        password_digest=b"d",
        created_ms=1_700_000_000_000,
        custom=custom,
    )


@pytest.fixture
def url(request: pytest.FixtureRequest) -> str:
    return fresh_zk_url(request)


@asynccontextmanager
async def zk_store(
    url: str, config: MetadataConfig = SHORT_SESSION
) -> AsyncIterator[ZooKeeperMetadataStore]:
    async with open_metadata(url, config) as store:
        yield cast("ZooKeeperMetadataStore", store)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[LocalZooKeeper]:
    """A server of the test's own, for tests that stop or kill it."""
    with LocalZooKeeper(tmp_path / "zookeeper", force_sync=False) as server:
        yield server


async def registered_addresses(store: ZooKeeperMetadataStore) -> list[str]:
    return [node.address for node in await store.list_nodes()]


async def test_layout_holds_records_as_encoded(url: str) -> None:
    async with zk_store(url) as store:
        ledger_id = 123_456
        await store.create_ledger(ledger(ledger_id))
        client = store.client
        root = store.paths.root
        layout, _ = client.get(f"{root}/layout")
        assert json.loads(layout) == {"layout_version": 1}
        assert client.get_children(f"{root}/streams") == []
        data, stat = client.get(f"{root}/ledgers/000000000000012/0000000000000123456")
        assert data == ledger(ledger_id).encode()
        assert stat.version == 0
        assert int(client.get(f"{root}/idgen/ledger")[0]) == 0  # no block reserved yet
        await store.allocate_ledger_id()
        assert int(client.get(f"{root}/idgen/ledger")[0]) == MetadataConfig().id_block_size


async def test_a_record_too_large_for_a_znode_is_refused(url: str) -> None:
    # under the configured limit (1 MiB) but over what a znode write can carry
    async with zk_store(url) as store:
        with pytest.raises(MetadataRecordTooLarge, match="over the limit"):
            await store.create_ledger(ledger(1, blob=b"x" * (1024 * 1024 - 3000)))


async def test_unreachable_server_names_url_and_what_to_check() -> None:
    url = f"zk://127.0.0.1:{free_loopback_port()}/pora"
    started = time.monotonic()
    with pytest.raises(MetadataUnavailable) as error:
        async with open_metadata(url, MetadataConfig(call_timeout_s=1)):
            pass
    # the 1 s asked for, not the 10 s default: half the default bounds it, so that a
    # loaded machine's slowness cannot fail the test
    assert time.monotonic() - started < 5
    assert url in str(error.value)
    assert "is ZooKeeper running at 127.0.0.1:" in str(error.value)


async def test_address_taken_says_the_session_holds_it(url: str) -> None:
    async with zk_store(url) as first, zk_store(url) as second:
        await first.register_node(NODE)
        with pytest.raises(NodeAddressTaken, match="until its ZooKeeper session ends"):
            await second.register_node(NodeRegistration(NODE.address, "instance-b"))
        # the same instance through another session (a restarted node) takes it back
        await second.register_node(NODE)
        owner = second.client.get(second.paths.node(NODE.address))[1].ephemeralOwner
        assert owner == second.client.client_id[0]


async def test_renew_recreates_a_registration_the_session_lost(url: str) -> None:
    async with zk_store(url) as store:
        await store.register_node(NODE)
        store.client.delete(store.paths.node(NODE.address))  # as if the session had lost it
        assert await registered_addresses(store) == []
        await store.renew_node(NODE.address, NODE.instance_id)
        assert await registered_addresses(store) == [NODE.address]


def expire_session(store: ZooKeeperMetadataStore) -> None:
    """End the store's session from the server's side: a second client attaching to
    the same session and closing it (the way kazoo's own tests expire sessions)."""
    hosts, _ = parse_zk_url(store.url)
    intruder = KazooClient(hosts=hosts, client_id=store.client.client_id)
    intruder.start(timeout=5)
    intruder.stop()
    intruder.close()


@pytest.mark.slow
async def test_registration_comes_back_after_session_expiry(url: str) -> None:
    async with zk_store(url) as store:
        await store.register_node(NODE)
        session = store.client.client_id[0]
        await trio.to_thread.run_sync(expire_session, store)

        def back_in_a_new_session() -> bool:
            try:
                _, stat = store.client.get(store.paths.node(NODE.address))
            except Exception:  # not yet re-created, or not reconnected
                return False
            return bool(stat.ephemeralOwner != session)

        # re-created by the connection listener: no renew_node call
        await wait_until(back_in_a_new_session, timeout_s=10)
        assert await registered_addresses(store) == [NODE.address]


@pytest.mark.slow
async def test_registration_survives_a_server_restart(
    own_server: LocalZooKeeper,
) -> None:
    async with (
        zk_store(own_server.url("/restart")) as store,
        zk_store(own_server.url("/restart")) as observer,
    ):
        await store.register_node(NODE)
        session = store.client.client_id[0]
        own_server.stop()
        await trio.sleep(2.5)  # longer than the 1 s session
        await trio.to_thread.run_sync(own_server.start)

        async def registered() -> bool:
            # both clients connected again, and the observer sees the registration
            if store.client.client_id is None or observer.client.client_id is None:
                return False
            try:
                return await registered_addresses(observer) == [NODE.address]
            except MetadataUnavailable:
                return False

        with trio.fail_after(15):
            while not await registered():  # noqa: ASYNC110 - polls another process's server
                await trio.sleep(0.05)
        # a restarted server restores its sessions from its log and restarts their
        # timeouts, so the session usually survives; if the reconnect came later than
        # the session timeout, the listener re-created the znode in the new session
        _, stat = observer.client.get(store.paths.node(NODE.address))
        assert stat.ephemeralOwner == store.client.client_id[0]
        assert session != 0
        await store.renew_node(NODE.address, NODE.instance_id)


REGISTER_AND_WAIT = textwrap.dedent(
    """
    import sys, anyio
    from pora.meta import MetadataConfig, NodeRegistration, open_metadata

    async def main() -> None:
        config = MetadataConfig(session_timeout_s=1.0)
        async with open_metadata(sys.argv[1], config) as store:
            await store.register_node(NodeRegistration("127.0.0.1:3181", "killed"))
            print("registered", flush=True)
            await anyio.sleep_forever()

    anyio.run(main)
    """
)


@pytest.mark.slow
async def test_registration_of_a_killed_process_ends_with_its_session(url: str) -> None:
    process = subprocess.Popen(  # noqa: ASYNC220 - a fork, not a wait
        [sys.executable, "-c", REGISTER_AND_WAIT, url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert await trio.to_thread.run_sync(process.stdout.readline) == "registered\n"
        async with zk_store(url) as store:
            assert await registered_addresses(store) == ["127.0.0.1:3181"]
            process.kill()
            killed = time.monotonic()
            with trio.fail_after(10):
                while await registered_addresses(store):  # noqa: ASYNC110 - the server expires it
                    await trio.sleep(0.05)
            # the session timeout (1 s) plus the server's expiry tick, not the 6 s default
            # session: bounded below that default, with room for a loaded machine
            assert time.monotonic() - killed < 5
            await store.register_node(NodeRegistration("127.0.0.1:3181", "next"))
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
async def test_local_server_keeps_its_data_across_kill_and_start(
    own_server: LocalZooKeeper,
) -> None:
    url = own_server.url("/kept")
    async with zk_store(url) as store:
        await store.create_ledger(ledger(1))
    own_server.kill()
    assert not own_server.running
    await trio.to_thread.run_sync(own_server.start)
    async with zk_store(url) as store:
        assert (await store.read_ledger(1)).version == 0
    assert own_server.url("/kept") == url  # the same port


def test_shared_server_answers() -> None:
    assert shared_zookeeper().running


async def test_a_renew_abandoned_by_its_caller_cannot_undo_a_later_unregister(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled `renew_node` goes on in its worker thread; an `unregister_node` made
    after it must still leave no registration behind (the renew must not re-create
    it after the removal)."""
    async with zk_store(fresh_zk_url(request)) as store:
        await store.register_node(NODE)
        registry = store._registry
        take = registry._take
        renewing = threading.Event()
        go_on = threading.Event()

        def slow_take(registration: NodeRegistration) -> NodeRegistration:
            renewing.set()
            go_on.wait(10)  # the renew stalls between its read and its write
            return take(registration)

        monkeypatch.setattr(registry, "_take", slow_take)
        with trio.move_on_after(0.05):  # the caller gives up; the thread goes on
            await trio.to_thread.run_sync(
                registry.renew, NODE.address, NODE.instance_id, abandon_on_cancel=True
            )
        assert renewing.is_set()
        monkeypatch.setattr(registry, "_take", take)
        unregistered = trio.Event()

        async def unregister() -> None:
            await store.unregister_node(NODE.address, NODE.instance_id)
            unregistered.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(unregister)
            await trio.sleep(0.05)  # the unregister waits for the stalled renew
            go_on.set()
        assert unregistered.is_set()
        assert await store.list_nodes() == []
