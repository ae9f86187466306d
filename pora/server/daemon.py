"""The `pora serve` daemon: a node, its network server, metrics and disk monitor.

Lifecycle:

1. Signals (SIGINT, SIGTERM) are watched from the first moment, so a signal during
   recovery stops the process cleanly too.
2. `open_node` locks the data dir and runs recovery (progress in the log).
3. The network server starts on `listen`; metrics/health on `metrics_listen` if
   set; the free-space monitor starts. With `metadata` set, before it listens the
   node checks the store's cluster id against its data dir's and its data dir
   against its instance's mark (membership.py): another cluster's store refuses the
   start (exit 2), a data dir behind its mark starts as a new instance, and the node
   answers a fence only once that mark is past it (node_mark.py). It then registers
   its advertised address in that store (registration.py) and keeps the lease alive;
   an address another live instance holds refuses the start (exit 2). It runs the
   ledger garbage collection (ledger_gc.py) on that store.
4. On the first signal: stop accepting, let in-flight requests finish (up to
   `drain_timeout_s`), remove the registration, then leave `open_node`, which
   writes what is queued, flushes every ledger and closes the node. A second
   signal cuts the drain short.
5. If a ledger's last flush failed (a full disk), the node keeps its journal and
   the daemon says so and exits 1, not "stopped cleanly".
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import trio

import pora
from journal.errors import PoraError
from pora.meta.store import MetadataStore
from pora.server.diskwatch import DiskMonitor, DiskThresholds
from pora.server.gc_tuning import freeze_and_tune
from pora.server.ledger_gc import LedgerCollector, LedgerGcConfig
from pora.server.membership import join_cluster, refuse_missing_store, start_mark
from pora.server.metrics import NodeMetrics, serve_metrics
from pora.server.node_mark import NodeMark
from pora.server.registration import (
    NodeRegistrar,
    NodeState,
    ReadOnlyNotifier,
    advertised_address,
    check_advertisable,
    open_registration_store,
    register_node,
)
from pora.server.settings import Address, Settings

if TYPE_CHECKING:
    from pora.server.server import Server, ServerStatistics

_log = logging.getLogger("pora.serve")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StartRefused(PoraError):
    """The daemon cannot start as configured (an address it cannot listen on, ...):
    `pora serve` says why and exits with status 2."""


async def _listen(
    what: str, address: Address, start: Callable[[], Awaitable[tuple[str, int]]]
) -> tuple[str, int]:
    """`start()` (which binds `address`), with the reasons a bind fails told plainly."""
    try:
        return await start()
    except OSError as error:
        raise StartRefused(_listen_failure(what, address, error)) from None


def _listen_failure(what: str, address: Address, error: OSError) -> str:
    flag = "--listen" if what == "the node" else "--metrics-listen"
    if error.errno == errno.EADDRINUSE:
        return (
            f"{address} is in use by another process: cannot listen there for {what}. "
            f"Stop that process or choose another port ({flag})"
        )
    if error.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {address} for {what}: no such address on this machine. "
            f"Use one of its addresses, 127.0.0.1, or 0.0.0.0 for all ({flag})"
        )
    if error.errno == errno.EACCES:
        return (
            f"cannot listen on {address} for {what}: permission denied (ports below 1024 "
            f"need privileges). Choose a port of 1024 or more ({flag})"
        )
    if isinstance(error, socket.gaierror):
        return f"cannot listen on {address} for {what}: {error.strerror} (check {flag})"
    return f"cannot listen on {address} for {what}: {error.strerror or error} (check {flag})"


def _settings_fields(settings: Settings) -> dict[str, object]:
    fields: dict[str, object] = {
        "data_dir": str(settings.data_dir),
        "listen": str(settings.listen),
        "metrics_listen": str(settings.metrics_listen) if settings.metrics_listen else "off",
        "read_only_free_bytes_min": settings.read_only_free_bytes_min,
        "read_only_free_percent_min": settings.read_only_free_percent_min,
        "metadata": settings.metadata or "off",
        "pid": os.getpid(),
    }
    fields.update({f"node.{k}": v for k, v in settings.node_options.items()})
    fields.update({f"server.{k}": v for k, v in settings.server_options.items()})
    return fields


def _make_server(node: pora.Node, settings: Settings) -> Server:
    from pora.server.server import Server, ServerConfig  # noqa: PLC0415 (keeps `--help` light)

    config = ServerConfig(
        host=settings.listen.host, port=settings.listen.port, **settings.server_options
    )
    return Server(node, config)


class _Stopper:
    """Turns signals into 'stop gracefully' (first) and 'stop now' (second)."""

    def __init__(self) -> None:
        self.requested = trio.Event()
        self.signal_name = ""
        self.drain_scope = trio.CancelScope()
        #: cancelled on a signal that arrives before startup finished
        self.startup_scope = trio.CancelScope()
        self.started = False

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if not self.requested.is_set():
                self.signal_name = name
                self.requested.set()
                _log.info("received %s: shutting down", name, extra={"fields": {"signal": name}})
                if not self.started:
                    self.startup_scope.cancel()
            else:
                _log.warning("received %s again: cutting the drain short", name)
                self.drain_scope.cancel()


async def run_daemon(
    settings: Settings,
    *,
    on_ready: Callable[[dict[str, str]], None] | None = None,
) -> int:
    """Run until a stop signal; returns the process exit status (0 after a clean stop,
    1 when the node stopped with ledgers unflushed and its journal kept)."""
    started_at = time.monotonic()
    stopper = _Stopper()
    unflushed: pora.FlushFailed | None = None
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with trio.open_nursery() as watcher:
            watcher.start_soon(stopper.watch, signals)
            try:
                await _run_node(settings, stopper, on_ready)
            except pora.FlushFailed as error:
                unflushed = error
            finally:
                watcher.cancel_scope.cancel()
    if unflushed is not None:
        _log.error(
            "stopped after %.1fs, not cleanly: %s",
            time.monotonic() - started_at,
            unflushed,
            extra={"fields": {"signal": stopper.signal_name, "error": "FlushFailed"}},
        )
        return 1
    _log.info(
        "stopped cleanly after %.1fs",
        time.monotonic() - started_at,
        extra={"fields": {"signal": stopper.signal_name}},
    )
    return 0


async def _run_node(
    settings: Settings,
    stopper: _Stopper,
    on_ready: Callable[[dict[str, str]], None] | None,
) -> None:
    _log.info(
        "starting pora %s on %s",
        pora.__version__,
        settings.data_dir,
        extra={"fields": _settings_fields(settings)},
    )
    check_advertisable(settings)
    refuse_missing_store(settings)
    registrar: NodeRegistrar | None = None
    with stopper.startup_scope:
        async with (
            open_registration_store(settings) as store,
            _open_node(settings, store) as (node, node_mark),
        ):
            collector = None if node_mark is None else await _join(node_mark, node, settings)
            server = _make_server(node, settings)
            read_only_switch = ReadOnlyNotifier(node)
            monitor = DiskMonitor(
                read_only_switch,
                node.data_dir.root,
                DiskThresholds(
                    settings.read_only_free_bytes_min,
                    settings.read_only_free_percent_min,
                    settings.read_only_hysteresis_bytes,
                ),
                settings.disk_check_interval_ms,
            )
            metrics = NodeMetrics(
                node,
                node.data_dir.journal_dir,
                server.statistics,
                disk_space=lambda: monitor.last_by_folder,
                registration=lambda: None if registrar is None else registrar.status,
                ledger_gc=lambda: None if collector is None else collector.statistics,
                mark=node_mark,
            )
            node.add_commit_listener(metrics.commits.on_commit)
            async with trio.open_nursery() as nursery:
                await monitor.check()  # start read-only if the disk is already full
                nursery.start_soon(monitor.run)
                host, port = await _listen(
                    "the node", settings.listen, lambda: nursery.start(server.run)
                )
                ready: dict[str, str] = {"listen": f"{host}:{port}"}
                metrics_listen = settings.metrics_listen
                if metrics_listen is not None:
                    if not _is_loopback(metrics_listen.host):
                        _log.warning(
                            "metrics listen on %s, which is not loopback: /metrics and "
                            "/health have no authentication",
                            metrics_listen,
                        )
                    m_host, m_port = await _listen(
                        "metrics", metrics_listen,
                        lambda: nursery.start(
                            serve_metrics, metrics, metrics_listen.host, metrics_listen.port
                        ),
                    )  # fmt: skip
                    ready["metrics_listen"] = f"{m_host}:{m_port}"
                if store is not None:
                    registrar = await register_node(
                        store,
                        settings,
                        node.data_dir.instance_id,
                        advertised_address(settings, (host, port)),
                        lambda: _node_state(node, monitor),
                        node_mark,
                    )
                    read_only_switch.listener = registrar.node_changed
                    nursery.start_soon(registrar.run)
                    ready["metadata"] = store.url
                    ready["advertise"] = registrar.address
                if collector is not None:
                    nursery.start_soon(collector.run)
                stopper.started = True
                # everything made so far lives as long as the process (gc_tuning.py)
                freeze_and_tune(settings.gc_young_threshold)
                _log.info("serving on %s", ready["listen"], extra={"fields": ready})
                if on_ready is not None:
                    on_ready(ready)
                await stopper.requested.wait()
                _log.info(
                    "stopping: no new connections; draining in-flight requests (up to %.1fs)",
                    settings.drain_timeout_s,
                )
                with stopper.drain_scope:
                    await server.shutdown(settings.drain_timeout_s)
                if registrar is not None:
                    # no new work reaches the node: clients stop being sent here
                    await registrar.unregister()
                _log.info(
                    "drained; flushing and closing the node",
                    extra={"fields": _server_fields(server.statistics())},
                )
                nursery.cancel_scope.cancel()
    if stopper.requested.is_set() and not stopper.started:
        _log.info("stopped during startup")


@contextlib.asynccontextmanager
async def _open_node(
    settings: Settings, store: MetadataStore | None
) -> AsyncIterator[tuple[pora.Node, NodeMark | None]]:
    """The node, and in a cluster its mark (R27): made before the node, which holds
    every fence behind it, and started by `_join` once the data dir is checked."""
    node_mark = None if store is None else NodeMark(store)
    fence_barrier = None if node_mark is None else node_mark.cover
    async with pora.open_node(
        settings.data_dir, fence_barrier=fence_barrier, **settings.node_options
    ) as node:
        yield node, node_mark


async def _join(node_mark: NodeMark, node: pora.Node, settings: Settings) -> LedgerCollector:
    """Join the mark's store's cluster, settle the instance id the node serves under
    and start its mark (R27), before any client can reach the node; and make its
    ledger GC."""
    store = node_mark.store
    cluster_id = await join_cluster(store, node.data_dir)
    await start_mark(node_mark, node, lambda: _journal_position(node))
    return LedgerCollector(
        node,
        store,
        cluster_id,
        LedgerGcConfig(
            settings.ledger_gc_interval_s,
            settings.ledger_gc_deletions_per_s,
            settings.ledger_gc_grace_s,
        ),
    )


def _node_state(node: pora.Node, monitor: DiskMonitor) -> NodeState:
    """What the registration says of the node: read-only or not, and the free space
    of the fullest filesystem it writes to."""
    spaces = [space.free_bytes for space in monitor.last_by_folder.values()]
    return NodeState(read_only=node.read_only is not None, free_bytes=min(spaces, default=0))


def _journal_position(node: pora.Node) -> int:
    """Every journal record below this seq is durable; it only grows, across restarts
    and trims (the node's mark, membership.py)."""
    return node.statistics().journal.dispatched_seq


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _server_fields(stats: ServerStatistics) -> dict[str, int]:
    """What the server did over its life, logged when its drain ends: the requests
    still in flight are those the drain timeout cut off."""
    return {
        "connections_accepted": stats.connections_accepted,
        "connections_refused": stats.connections_refused,
        "connections_open": stats.connections_open,
        "protocol_errors": stats.protocol_errors,
        "requests": sum(stats.requests_by_opcode.values()),
        "requests_inflight": stats.requests_inflight,
        "responses_failed": sum(
            count for status, count in stats.responses_by_status.items() if status != "ok"
        ),
        "bytes_received": stats.bytes_received,
        "bytes_sent": stats.bytes_sent,
    }
