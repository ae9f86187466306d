"""The replicating client's Prometheus metrics, when the application asks for them:

    registry = prometheus_client.CollectorRegistry()
    async with pora.connect(url, metrics=registry) as client:
        ...   # registry now holds pora_client_* (serve it with the application's own)

Without `metrics` nothing here is imported or called: the writer's only trace of it
is a check per acknowledged range and per scheduler turn of appends, never per
append (docs/performance.md has the measure).

What moves when:

- appends and their bytes, counted per acknowledged range (R4);
- the acknowledgement latency, one observation per scheduler turn of appends: the
  appends a task makes in one turn start together and are acknowledged together, so
  the turn's latency is each of theirs, and the histogram costs one observation per
  turn rather than per append (its `_count` is turns, not appends);
- writers stopped, by the error that stopped them (fenced, deleted, no nodes, ...);
- ensemble changes written (R9), recoveries run (R16..R22: an `open_ledger` of an
  open ledger, a stream takeover), speculative reads sent (R24: a read that asked
  the next replica because the first did not answer within
  `speculative_read_delay_s`);
- the payload bytes pending (appended, not yet acknowledged) and their bound, read
  when scraped.

One client per registry: a second client's metrics on the same registry would
repeat the names (prometheus_client raises ValueError).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from netio.budget import Budget

#: seconds: from a fast local cluster's fraction of a millisecond to a stalled node's
#: replacement
ACK_SECONDS_BUCKETS: Final = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


class _PendingBytes(Collector):
    """The client's pending payload bytes and their bound, read at scrape time."""

    def __init__(self, pending: Budget) -> None:
        self._pending = pending

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "pora_client_pending_bytes",
            "Payload bytes appended and not yet acknowledged, over every ledger",
            value=float(self._pending.used),
        )
        yield GaugeMetricFamily(
            "pora_client_pending_bytes_max",
            "The bound on pending payload bytes (ClientConfig.pending_bytes_max)",
            value=float(self._pending.limit),
        )


class ClientMetrics:
    """The metrics of one client, registered in the application's registry."""

    def __init__(
        self,
        registry: CollectorRegistry,
        pending_bytes: Budget,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock = clock
        self._appends = Counter(
            "pora_client_appends", "Appends acknowledged (R4)", registry=registry
        )
        self._appended_bytes = Counter(
            "pora_client_appended_bytes", "Payload bytes of the appends acknowledged",
            registry=registry,
        )  # fmt: skip
        self._ack_seconds = Histogram(
            "pora_client_ack_seconds",
            "From append to acknowledgement, one observation per scheduler turn of appends",
            buckets=ACK_SECONDS_BUCKETS,
            registry=registry,
        )
        self._writers_stopped = Counter(
            "pora_client_writers_stopped",
            "Ledger writers stopped by an error, by the error's type",
            ["error"],
            registry=registry,
        )
        self._ensemble_changes = Counter(
            "pora_client_ensemble_changes",
            "Ensemble changes written to ledger records (R9)",
            registry=registry,
        )
        self._recoveries = Counter(
            "pora_client_recoveries", "Ledger recoveries run (R16..R22)", registry=registry
        )
        self._speculative_reads = Counter(
            "pora_client_speculative_reads",
            "Reads also sent to the next replica after speculative_read_delay_s (R24)",
            registry=registry,
        )
        registry.register(_PendingBytes(pending_bytes))

    def acknowledged(self, appends: int, payload_bytes: int) -> None:
        self._appends.inc(appends)
        self._appended_bytes.inc(payload_bytes)

    def turn_acknowledged(self, started: float, now: float) -> None:
        self._ack_seconds.observe(now - started)

    def writer_stopped(self, error: BaseException) -> None:
        self._writers_stopped.labels(type(error).__name__).inc()

    def ensemble_changed(self) -> None:
        self._ensemble_changes.inc()

    def recovered(self) -> None:
        self._recoveries.inc()

    def speculative_read(self) -> None:
        self._speculative_reads.inc()
