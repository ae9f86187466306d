"""Prometheus metrics and the health endpoint of a running node.

Counters and histograms that move with the write path (records, bytes, group
sizes, fsync latency) are fed by the node's commit listener: one call per group
commit, not per add, so the cost on the hot path is a few lock-free-ish
increments per sync. Everything else (segments, ledgers, memtable bytes,
connections, errors, read-only) is read from `statistics()` at scrape time by a
custom collector.

The HTTP side is a tiny HTTP/1.1 server on trio sockets (`serve_metrics`): GET
/metrics renders the registry with `prometheus_client.generate_latest`, GET
/health answers 200 "ok" or 503 with the reason. No extra threads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from journal.segment import list_segments

_log = logging.getLogger("pora.metrics")

CONTENT_TYPE_PROMETHEUS: Final = "text/plain; version=0.0.4; charset=utf-8"
REQUEST_BYTES_MAX: Final = 8192
REQUEST_TIMEOUT_S: Final = 5.0
CONNECTIONS_MAX: Final = 64

GROUP_RECORDS_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
FSYNC_SECONDS_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


class StatisticsSource(Protocol):
    """What the collector reads at scrape time (a `pora.Node`)."""

    def statistics(self) -> Any: ...

    @property
    def read_only(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    reason: str


def node_health(node: StatisticsSource) -> Health:
    """Healthy unless the node is read-only or its journal has failed."""
    reason = node.read_only
    if reason is not None:
        return Health(False, f"read-only: {reason}")
    if node.statistics().journal.failed:
        return Health(False, "the journal failed: writes are refused until restart")
    return Health(True, "ok")


class CommitMetrics:
    """The metrics fed per group commit (the node's commit listener)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.records = Counter(
            "pora_journal_records",
            "Records made durable in the journal (adds, and the rare fence/close/delete)",
            registry=registry,
        )
        self.bytes = Counter(
            "pora_journal_bytes",
            "Bytes made durable in the journal (records with their headers)",
            registry=registry,
        )
        self.group_records = Histogram(
            "pora_group_commit_records",
            "Records per group commit (one write + one fdatasync)",
            buckets=GROUP_RECORDS_BUCKETS,
            registry=registry,
        )
        self.fsync_seconds = Histogram(
            "pora_journal_fsync_seconds",
            "Latency of the journal's fdatasync per group commit",
            buckets=FSYNC_SECONDS_BUCKETS,
            registry=registry,
        )

    def on_commit(self, records: int, written_bytes: int, fsync_seconds: float) -> None:
        self.records.inc(records)
        self.bytes.inc(written_bytes)
        self.group_records.observe(records)
        self.fsync_seconds.observe(fsync_seconds)


def _number(record: object, name: str) -> float | None:
    value = getattr(record, name, None)
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


class FreeSpace(Protocol):
    """One filesystem measurement (`pora.diskwatch.DiskSpace`)."""

    @property
    def free_bytes(self) -> int: ...

    @property
    def total_bytes(self) -> int: ...


class RegistrationFigures(Protocol):
    """The node's registration in a metadata store (registration.py)."""

    url: str
    registered: bool
    renew_failures: int
    address_taken: int
    reregistrations: int


def _registration_metrics(status: RegistrationFigures) -> Iterable[Metric]:
    registered = GaugeMetricFamily(
        "pora_registered",
        "1 while the node holds its registration in the metadata store",
        labels=["metadata"],
    )
    registered.add_metric([status.url], 1 if status.registered else 0)
    yield registered
    yield _counter(
        "pora_registration_failures",
        "Renewals or registrations the metadata store did not answer",
        status.renew_failures,
    )
    yield _counter(
        "pora_registration_address_taken",
        "Attempts to register again refused: another live instance holds the address",
        status.address_taken,
    )
    yield _counter(
        "pora_registration_reregistrations",
        "Registrations made again after the lease ran out (a metadata store outage)",
        status.reregistrations,
    )


class MarkFigures(Protocol):
    """The node's mark in the metadata store (node_mark.py, R27)."""

    mark: int | None
    failures: int
    fence_writes: int


def _mark_metrics(figures: MarkFigures) -> Iterable[Metric]:
    yield _gauge(
        "pora_node_mark",
        "The journal position the metadata store holds as this instance's mark (R27)",
        -1 if figures.mark is None else figures.mark,
    )
    yield _counter(
        "pora_node_mark_fence_writes",
        "Mark writes made so that a fence could be answered",
        figures.fence_writes,
    )
    yield _counter(
        "pora_node_mark_failures",
        "Mark writes the metadata store refused or did not answer (a fence among them "
        "is answered OVERLOADED)",
        figures.failures,
    )


class LedgerGcFigures(Protocol):
    """What the node's ledger garbage collection did (ledger_gc.py)."""

    passes: int
    passes_skipped: int
    ledgers_deleted: int
    bytes_deleted: int
    delete_failures: int


def _ledger_gc_metrics(figures: LedgerGcFigures) -> Iterable[Metric]:
    for name, documentation, value in (
        ("passes", "Passes of the ledger garbage collection started", figures.passes),
        (
            "passes_skipped",
            "Passes cut short: the metadata store could not be read or is another cluster's",
            figures.passes_skipped,
        ),
        (
            "deleted_ledgers",
            "Ledgers deleted because the metadata store no longer knows them",
            figures.ledgers_deleted,
        ),
        ("deleted_bytes", "Payload bytes of the ledgers deleted", figures.bytes_deleted),
        ("delete_failures", "Deletions the node refused", figures.delete_failures),
    ):
        yield _counter(f"pora_ledger_gc_{name}", documentation, value)


class NodeCollector(Collector):
    """Gauges and counters read from the node (and server) statistics per scrape."""

    def __init__(
        self,
        node: StatisticsSource,
        journal_dir: Path,
        server_statistics: Callable[[], object] | None = None,
        disk_space: Callable[[], Mapping[str, FreeSpace]] | None = None,
        registration: Callable[[], RegistrationFigures | None] | None = None,
        ledger_gc: Callable[[], LedgerGcFigures | None] | None = None,
        mark: MarkFigures | None = None,
    ) -> None:
        self.node = node
        self.journal_dir = journal_dir
        self.server_statistics = server_statistics
        self.disk_space = disk_space
        self.registration = registration
        self.ledger_gc = ledger_gc
        self.mark = mark

    def collect(self) -> Iterable[Metric]:
        stats = self.node.statistics()
        journal = stats.journal
        ledgers = stats.ledgers
        yield _gauge("pora_read_only", "1 while the node refuses writes", self.node.read_only)
        yield _gauge("pora_journal_failed", "1 once the journal has failed", journal.failed)
        yield _gauge(
            "pora_journal_segments",
            "Journal segment files on disk",
            len(list_segments(self.journal_dir)),
        )
        yield _gauge(
            "pora_journal_queued_batches", "Batches waiting for the journal", journal.queued_batches
        )
        yield _counter("pora_journal_commits", "Group commits (fdatasyncs)", journal.commits)
        yield _gauge("pora_ledgers", "Ledgers on the node", ledgers.ledgers)
        stored_bytes = getattr(self.node, "stored_bytes", None)
        if stored_bytes is not None:
            payload, logged = stored_bytes()
            yield _gauge(
                "pora_ledger_payload_bytes", "Payload bytes of the ledgers stored", payload
            )
            yield _gauge(
                "pora_entry_log_bytes", "Bytes of the entry logs (records with headers)", logged
            )
        yield _gauge(
            "pora_open_ledgers", "Ledgers with a running worker (open)", ledgers.active_workers
        )
        yield _gauge(
            "pora_memtable_bytes",
            "Bytes in memtables not yet flushed to entry logs",
            ledgers.memtable_unflushed_bytes,
        )
        yield _gauge("pora_open_files", "Open entry-log files", ledgers.open_files)
        yield _counter(
            "pora_journal_segments_trimmed",
            "Journal segments trimmed (deleted, or recycled into spares)",
            stats.journal_segments_trimmed,
        )
        yield _counter(
            "pora_journal_spare_segments_made",
            "Zero-filled spare journal segments made ahead of need",
            journal.spare_segments_made,
        )
        yield _counter(
            "pora_journal_spare_segments_taken",
            "Segment rolls that found a spare ready (the rest preallocated)",
            journal.spare_segments_taken,
        )
        yield _counter(
            "pora_journal_spare_segments_recycled",
            "Trimmed journal segments kept as spares (no zeros to write for them)",
            journal.spare_segments_recycled,
        )
        if self.server_statistics is not None:
            yield from _server_metrics(self.server_statistics())
        if self.disk_space is not None:
            yield from _disk_metrics(self.disk_space())
        status = None if self.registration is None else self.registration()
        if status is not None:
            yield from _registration_metrics(status)
        if self.mark is not None:
            yield from _mark_metrics(self.mark)
        gc_figures = None if self.ledger_gc is None else self.ledger_gc()
        if gc_figures is not None:
            yield from _ledger_gc_metrics(gc_figures)


def _disk_metrics(by_folder: Mapping[str, FreeSpace]) -> Iterable[Metric]:
    """Free and total bytes of the filesystem of each folder the node writes to, as
    the free-space monitor last measured them (folders sharing one repeat it)."""
    free = GaugeMetricFamily(
        "pora_disk_free_bytes",
        "Bytes free for the node on the filesystem of each data dir folder",
        labels=["folder"],
    )
    total = GaugeMetricFamily(
        "pora_disk_size_bytes",
        "Size of the filesystem of each data dir folder",
        labels=["folder"],
    )
    for folder, space in sorted(by_folder.items()):
        free.add_metric([folder], float(space.free_bytes))
        total.add_metric([folder], float(space.total_bytes))
    yield free
    yield total


def _gauge(name: str, documentation: str, value: object) -> GaugeMetricFamily:
    if isinstance(value, str):
        value = 1  # a reason: the flag is set
    elif value is None:
        value = 0
    return GaugeMetricFamily(name, documentation, value=float(value))  # type: ignore[arg-type]


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=float(value))


def _server_metrics(stats: object) -> Iterable[Metric]:
    """Connections, requests and responses by status from `Server.statistics()`.

    Reads fields by name, so a field the server drops never breaks a scrape.
    """
    for name, documentation, kind in (
        ("connections_open", "Open client connections", "gauge"),
        ("connections_accepted", "Client connections accepted", "counter"),
        ("connections_refused", "Connections turned away at the connection limit", "counter"),
        ("protocol_errors", "Connections closed for bytes that are not the protocol", "counter"),
        ("requests_inflight", "Requests being served", "gauge"),
        ("bytes_received", "Bytes received from clients", "counter"),
        ("bytes_sent", "Bytes sent to clients", "counter"),
        ("bytes_buffered", "Bytes received and not yet decoded", "gauge"),
        ("read_bytes_held", "Bytes of read responses held (read_bytes_node_max)", "gauge"),
        ("reads_waiting", "Reads waiting for room under the read-response limits", "gauge"),
    ):
        value = _number(stats, name)
        if value is None:
            continue
        metric_name = f"pora_server_{name}"
        if kind == "counter":
            yield _counter(metric_name, documentation, value)
        else:
            yield GaugeMetricFamily(metric_name, documentation, value=value)
    by_opcode = getattr(stats, "requests_by_opcode", None)
    if isinstance(by_opcode, Mapping):
        family = CounterMetricFamily(
            "pora_server_requests", "Requests received, by operation", labels=["op"]
        )
        for key, count in sorted(by_opcode.items(), key=lambda kv: _label(kv[0])):
            family.add_metric([_label(key)], float(count))
        yield family
    by_status = getattr(stats, "responses_by_status", None)
    if isinstance(by_status, Mapping):
        responses = CounterMetricFamily(
            "pora_server_responses", "Responses sent, by status", labels=["status"]
        )
        errors = CounterMetricFamily(
            "pora_server_errors", "Responses with a failure status, by status", labels=["status"]
        )
        for key, count in sorted(by_status.items(), key=lambda kv: _label(kv[0])):
            label = _label(key)
            responses.add_metric([label], float(count))
            if label != "ok":
                errors.add_metric([label], float(count))
        yield responses
        yield errors


def _label(key: object) -> str:
    name = getattr(key, "name", None)
    return name.lower() if isinstance(name, str) else str(key)


class NodeMetrics:
    """The registry of one node: commit-fed metrics plus the scrape-time collector."""

    def __init__(
        self,
        node: StatisticsSource,
        journal_dir: Path,
        server_statistics: Callable[[], object] | None = None,
        disk_space: Callable[[], Mapping[str, FreeSpace]] | None = None,
        registration: Callable[[], RegistrationFigures | None] | None = None,
        ledger_gc: Callable[[], LedgerGcFigures | None] | None = None,
        mark: MarkFigures | None = None,
    ) -> None:
        self.node = node
        self.registry = CollectorRegistry(auto_describe=False)
        self.commits = CommitMetrics(self.registry)
        self.registry.register(
            NodeCollector(
                node, journal_dir, server_statistics, disk_space, registration, ledger_gc, mark
            )
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def health(self) -> Health:
        return node_health(self.node)


# --- the HTTP endpoint -----------------------------------------------------------------------


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _read_head(stream: trio.abc.ReceiveStream) -> bytes | None:
    """The request head (up to the blank line), or None if it is too large/cut."""
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > REQUEST_BYTES_MAX:
            return None
        chunk = await stream.receive_some(4096)
        if not chunk:
            return None
        buffer += chunk
    return bytes(buffer)


def answer(metrics: NodeMetrics, head: bytes | None) -> bytes:
    """The full HTTP response to one request head (pure: testable without sockets)."""
    if head is None:
        return _response("400 Bad Request", "text/plain", b"bad request\n")
    request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return _response("400 Bad Request", "text/plain", b"bad request\n")
    method, target = parts[0], parts[1].split("?", 1)[0]
    if method not in ("GET", "HEAD"):
        return _response("405 Method Not Allowed", "text/plain", b"only GET\n")
    if target == "/metrics":
        return _response("200 OK", CONTENT_TYPE_PROMETHEUS, metrics.render())
    if target == "/health":
        health = metrics.health()
        body = (health.reason + "\n").encode()
        status = "200 OK" if health.ok else "503 Service Unavailable"
        return _response(status, "text/plain; charset=utf-8", body)
    return _response("404 Not Found", "text/plain", b"try /metrics or /health\n")


async def serve_metrics(
    metrics: NodeMetrics,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve /metrics and /health on host:port until cancelled; reports the bound address."""
    limiter = trio.CapacityLimiter(CONNECTIONS_MAX)

    async def handle(stream: trio.SocketStream) -> None:
        async with limiter, stream:
            try:
                with trio.move_on_after(REQUEST_TIMEOUT_S):
                    head = await _read_head(stream)
                    try:
                        response = answer(metrics, head)
                    except Exception:  # a scrape must never take the node down
                        _log.exception("metrics request failed")
                        response = _response("500 Internal Server Error", "text/plain", b"")
                    await stream.send_all(response)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass  # the scraper went away

    listeners = await trio.open_tcp_listeners(port, host=host)
    sockname = listeners[0].socket.getsockname()
    _log.info(
        "metrics on http://%s:%d/metrics", sockname[0], sockname[1],
        extra={"fields": {"metrics_listen": f"{sockname[0]}:{sockname[1]}"}},
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        task_status.started((sockname[0], sockname[1]))
        await trio.serve_listeners(handle, listeners, handler_nursery=nursery)
