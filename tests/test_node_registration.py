"""A node's registration in the metadata store: `pora serve --metadata` as a real
process (registered, unregistered on SIGTERM, expired after SIGKILL, taken back on
restart, refused on an address another live instance holds), and the registrar's
renewals against a real store (state changes, a lost registration, a taken address)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from serve_helpers import http_get, samples
from waiting import wait_until_true
from zookeeper_support import fresh_zk_url

from pora.meta.backends import open_metadata
from pora.meta.errors import MetadataUnavailable
from pora.meta.local_zookeeper import LocalZooKeeper
from pora.meta.records import NodeRegistration
from pora.meta.store import MetadataStore
from pora.node.datadir import open_data_dir
from pora.server.registration import NodeRegistrar, NodeState

START_TIMEOUT_S = 30.0
LEASE_S = 1.0
#: the lease of a node killed to check that its registration outlives it
KILLED_LEASE_S = 30.0


@pytest.fixture(params=["sqlite", "zk"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "zk":
        return fresh_zk_url(request)
    return f"sqlite://{tmp_path}/meta.db"


@dataclass
class Node:
    process: trio.Process
    address: str
    log_path: Path
    metrics_port: int


@asynccontextmanager
async def serve(
    data_dir: Path,
    tmp_path: Path,
    metadata_url: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Node]:
    """A `pora serve --metadata` process, started and ready (serving and registered);
    killed at the end unless the test stopped it."""
    ready = tmp_path / f"ready-{os.urandom(4).hex()}.json"
    log_path = tmp_path / f"serve-{os.urandom(4).hex()}.log"
    command = [
        sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
        "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
        "--ready-file", str(ready), "--metadata", metadata_url,
        "--registration-lease-s", str(LEASE_S), *extra,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            command, stderr=log, env={**os.environ, **(env or {})}
        )
    try:
        with trio.fail_after(START_TIMEOUT_S):
            while not ready.exists():
                assert process.poll() is None, log_path.read_text()
                await trio.sleep(0.02)
        addresses = json.loads(ready.read_text())
        assert addresses["metadata"] == metadata_url
        yield Node(
            process,
            addresses["advertise"],
            log_path,
            int(addresses["metrics_listen"].rsplit(":", 1)[1]),
        )
    finally:
        if process.poll() is None:
            process.kill()
        await process.wait()


async def stop(node: Node, signum: int = signal.SIGTERM) -> int:
    node.process.send_signal(signum)
    with trio.fail_after(START_TIMEOUT_S):
        return await node.process.wait()


async def nodes_in(url: str) -> dict[str, NodeRegistration]:
    async with open_metadata(url) as store:
        return {n.address: n for n in await store.list_nodes()}


@pytest.mark.slow
async def test_a_served_node_registers_and_a_sigterm_unregisters_it_at_once(
    data_dir: Path, tmp_path: Path, metadata_url: str
) -> None:
    async with serve(data_dir, tmp_path, metadata_url, "--rack", "r1") as node:
        registered = (await nodes_in(metadata_url))[node.address]
        assert registered.instance_id == open_data_dir(data_dir, create=False).instance_id
        assert registered.free_bytes > 0
        assert registered.rack == "r1"
        assert not registered.read_only
        values = samples((await http_get(node.metrics_port, "/metrics"))[1])
        assert values[f"pora_registered{{metadata={metadata_url}}}"] == 1
        # renewals keep it past several leases
        await trio.sleep(LEASE_S * 2)
        assert node.address in await nodes_in(metadata_url)
        assert await stop(node) == 0
        assert await nodes_in(metadata_url) == {}


@pytest.mark.slow
async def test_a_killed_node_is_gone_after_its_lease_and_a_restart_takes_it_back(
    data_dir: Path, tmp_path: Path, metadata_url: str
) -> None:
    # a lease far longer than the check below can take on a loaded machine (with the
    # 1 s one, a slow store connection could see it run out first)
    lease_s = str(KILLED_LEASE_S)
    async with serve(data_dir, tmp_path, metadata_url, "--registration-lease-s", lease_s) as node:
        address = node.address
        assert await stop(node, signal.SIGKILL) == -signal.SIGKILL
    assert address in await nodes_in(metadata_url)  # until the lease runs out

    # the same data dir on the same address, while the old lease lives: its own (and
    # its 1 s lease replaces the old one: gone below long before KILLED_LEASE_S)
    async with serve(data_dir, tmp_path, metadata_url, "--listen", address) as node:
        assert node.address == address
        assert await stop(node, signal.SIGKILL) == -signal.SIGKILL

    async def gone() -> bool:
        return address not in await nodes_in(metadata_url)

    await wait_until_true(gone, LEASE_S * 10)


@pytest.mark.slow
async def test_another_data_dir_on_a_live_nodes_address_is_refused(
    data_dir: Path, tmp_path: Path, metadata_url: str
) -> None:
    async with serve(data_dir, tmp_path, metadata_url) as node:
        holder = open_data_dir(data_dir, create=False).instance_id
        command = [
            sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(tmp_path / "other"),
            "--listen", "127.0.0.1:0", "--advertise", node.address, "--metadata",
            metadata_url, "--log-format", "logfmt",
        ]  # fmt: skip
        result = await trio.run_process(command, capture_stderr=True, check=False)
        assert result.returncode == 2
        errors = [line for line in result.stderr.decode().splitlines() if "level=error" in line]
        assert len(errors) == 1, result.stderr.decode()
        assert f"address {node.address} is held by the live node instance {holder}" in errors[0]
        assert "Stop that node" in errors[0]
        assert (await nodes_in(metadata_url))[node.address].instance_id == holder
        assert await stop(node) == 0


async def test_an_unreachable_store_refuses_the_start(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/no-such-folder/meta.db"
    command = [
        sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(tmp_path / "data"),
        "--listen", "127.0.0.1:0", "--metadata", url, "--log-format", "logfmt",
    ]  # fmt: skip
    result = await trio.run_process(command, capture_stderr=True, check=False)
    assert result.returncode == 2
    assert f"metadata store {url} is unavailable" in result.stderr.decode()
    assert not (tmp_path / "data").exists()  # refused before the data dir was touched


def test_a_wildcard_listen_address_needs_an_advertised_one(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(tmp_path / "data"),
        "--listen", "0.0.0.0:0", "--metadata", f"sqlite://{tmp_path}/meta.db",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "--advertise HOST:PORT" in result.stderr


@pytest.mark.slow
async def test_a_read_only_node_registers_read_only(
    data_dir: Path, tmp_path: Path, metadata_url: str
) -> None:
    async with serve(
        data_dir, tmp_path, metadata_url, env={"PORA_READ_ONLY_FREE_BYTES_MIN": "1000000TiB"}
    ) as node:
        assert (await nodes_in(metadata_url))[node.address].read_only
        assert await stop(node) == 0


# --- the registrar against a real store ------------------------------------------------


@asynccontextmanager
async def registrar_on(url: str, state: list[NodeState]) -> AsyncIterator[NodeRegistrar]:
    async with open_metadata(url) as store:
        registrar = NodeRegistrar(
            store, "127.0.0.1:4000", "instance-a", None, 30.0, lambda: state[0]
        )
        await registrar.register()
        yield registrar


async def registered(store: MetadataStore) -> NodeRegistration:
    (only,) = await store.list_nodes()
    return only


async def test_a_read_only_switch_updates_the_registration_at_once(metadata_url: str) -> None:
    state = [NodeState(read_only=False, free_bytes=10 << 30)]
    async with registrar_on(metadata_url, state) as registrar, trio.open_nursery() as nursery:
        nursery.start_soon(registrar.run)  # renews every 10 s: only the switch acts sooner
        state[0] = NodeState(read_only=True, free_bytes=10 << 30)
        registrar.node_changed()

        async def read_only() -> bool:
            return (await registered(registrar.store)).read_only

        await wait_until_true(read_only, 5)
        await registrar.unregister()
        assert await registrar.store.list_nodes() == []
        nursery.cancel_scope.cancel()


async def test_free_space_is_updated_only_when_it_moved_enough(metadata_url: str) -> None:
    state = [NodeState(read_only=False, free_bytes=10 << 30)]
    async with registrar_on(metadata_url, state) as registrar:
        state[0] = NodeState(read_only=False, free_bytes=(10 << 30) - (1 << 20))
        await registrar.tick()
        assert (await registered(registrar.store)).free_bytes == 10 << 30
        state[0] = NodeState(read_only=False, free_bytes=5 << 30)
        await registrar.tick()
        assert (await registered(registrar.store)).free_bytes == 5 << 30


async def test_a_lost_registration_is_registered_again_unless_another_holds_it(
    metadata_url: str,
) -> None:
    state = [NodeState(read_only=False, free_bytes=1 << 30)]
    async with registrar_on(metadata_url, state) as registrar:
        store = registrar.store
        await store.unregister_node(registrar.address, registrar.instance_id)  # lost
        await registrar.tick()
        assert (await registered(store)).instance_id == "instance-a"
        assert registrar.status.registered
        assert registrar.status.reregistrations == 1

        await store.unregister_node(registrar.address, registrar.instance_id)
        await store.register_node(NodeRegistration(registrar.address, "instance-b"), 30.0)
        await registrar.tick()
        await registrar.tick()
        assert not registrar.status.registered
        assert registrar.status.address_taken == 2
        assert (await registered(store)).instance_id == "instance-b"

        await store.unregister_node(registrar.address, "instance-b")  # the other stops
        await registrar.tick()
        assert registrar.status.registered
        assert (await registered(store)).instance_id == "instance-a"


@pytest.mark.slow
async def test_a_served_node_stays_registered_through_a_zookeeper_restart(
    data_dir: Path, tmp_path: Path
) -> None:
    """ZooKeeper stopped for longer than the node's session (its 1 s lease) and started
    again: the node is registered afterwards (its session restored by the server, or its
    registration re-created in a new one), keeps renewing, and still unregisters on
    SIGTERM."""
    with LocalZooKeeper(tmp_path / "zookeeper", force_sync=False) as server:
        url = server.url("/restart")
        async with serve(data_dir, tmp_path, url) as node:
            assert node.address in await nodes_in(url)
            await trio.to_thread.run_sync(server.stop)
            await trio.sleep(LEASE_S * 2.5)  # the outage: real time, longer than the session
            await trio.to_thread.run_sync(server.start)

            async def registered() -> bool:
                try:
                    return node.address in await nodes_in(url)
                except MetadataUnavailable:
                    return False

            await wait_until_true(registered, 20)
            await trio.sleep(LEASE_S * 2)  # renewals go on after the outage
            assert node.address in await nodes_in(url)
            assert node.process.poll() is None
            assert await stop(node) == 0
            assert await nodes_in(url) == {}
