"""The replicating client's settings: failure detection, waits and bounds. Every
queue and wait the client keeps has its limit here (docs/replication.md names the
rule each one serves)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pora.meta.config import MetadataConfig


@dataclass(frozen=True)
class ClientConfig:
    #: R8: a request to a node with no answer after this long fails that node for the
    #: ledger (a write: ensemble change; a read: the next replica)
    node_timeout_s: float = 10.0
    #: connecting to a node gives up after this long (then R8)
    connect_timeout_s: float = 5.0
    #: R12: with no replacement node, appends wait this long for one to register
    ensemble_change_timeout_s: float = 30.0
    #: R7: an idle writer tells the nodes its newer LAC after this long
    lac_flush_interval_s: float = 1.0
    #: R24: a read with no answer after this long is also sent to the next replica
    speculative_read_delay_s: float = 0.05
    #: R25: a tail's long poll waits on a node this long before asking again
    tail_poll_wait_s: float = 10.0
    #: R17, R19: a recovery asks a member that gave no usable answer this many times
    recovery_attempts_max: int = 3
    #: R17: fencing waits this long for coverage before the recovery fails
    recovery_fence_timeout_s: float = 30.0
    #: appends of one ledger sent and not yet acknowledged (or failed), at most;
    #: `append` waits for room
    pending_appends_per_ledger_max: int = 10_000
    #: payload bytes of appends pending over all ledgers of one client, at most
    pending_bytes_max: int = 256 << 20
    #: add calls in flight to one node, at most (each carries every ledger's adds for
    #: that node of one turn: `pora/client/node_calls.py`)
    calls_in_flight_per_node_max: int = 8
    #: R8: payload bytes one node may owe (queued for it or in flight to it) beyond the
    #: client's pending payload bytes, at most: what it owes past that was already
    #: acknowledged elsewhere, so a node that far behind is failed for the ledgers it
    #: owes (replaced, R9) and its queue dropped, instead of the writer keeping copies
    #: for it without bound
    node_backlog_bytes_max: int = 64 << 20
    #: payload bytes one add call to a node carries, at most (a single entry larger than
    #: this goes alone): a backlog goes out as several calls, each within its deadline
    add_call_bytes_max: int = 4 << 20
    #: R9: a member that failed for a ledger is not chosen again for it for this long
    #: (the client's monotonic clock); then it may be, so that short partitions do not
    #: use up the cluster. Keep it under `ensemble_change_timeout_s`, so that a writer
    #: waiting for a replacement sees quarantines expire before it gives up (R12)
    node_quarantine_s: float = 10.0
    #: the largest payload an append takes: the nodes' default `entry_bytes_max` (4 MiB)
    #: less the replicated entry's 13-byte header; a larger one is refused before it
    #: is given an id (nodes configured with a smaller limit refuse it themselves,
    #: which ends the writer)
    payload_bytes_max: int = (4 << 20) - 13
    #: entries and bytes a sequential read asks a node for in one range read
    read_range_entries_max: int = 1000
    read_range_bytes_max: int = 4 << 20
    #: the metadata store's settings (timeouts, id blocks, ZooKeeper session)
    metadata: MetadataConfig = field(default_factory=MetadataConfig)

    def __post_init__(self) -> None:
        for name in (
            "node_timeout_s",
            "connect_timeout_s",
            "ensemble_change_timeout_s",
            "lac_flush_interval_s",
            "tail_poll_wait_s",
            "recovery_fence_timeout_s",
            "node_quarantine_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"ClientConfig.{name} must be positive")
        if self.speculative_read_delay_s < 0:
            raise ValueError("ClientConfig.speculative_read_delay_s must be >= 0")
        for name in (
            "recovery_attempts_max",
            "pending_appends_per_ledger_max",
            "pending_bytes_max",
            "calls_in_flight_per_node_max",
            "node_backlog_bytes_max",
            "add_call_bytes_max",
            "read_range_entries_max",
            "payload_bytes_max",
            "read_range_bytes_max",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ClientConfig.{name} must be >= 1")
