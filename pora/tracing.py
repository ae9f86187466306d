"""Per-hop timestamps of appends, for `scripts/bench_latency.py` (docs/performance.md,
"Latency, hop by hop").

Off unless the environment variable `PORA_TRACE_FILE` names a path prefix when this
module is first imported (or `enable` is called before the traced objects are
made): then each process writes its records to `<prefix>.<pid>`, so a client and
the `pora serve` processes it talks to, all started with the variable, each keep
their own file. Every timestamp is `time.monotonic_ns()`, one clock for all the
processes of a machine, so the script can set them side by side.

The traced objects read `current()` once, when they are made, and keep it; off,
the hot path pays one `is not None` test per batch (a read, a group, a write),
never one per entry.

A record is one text line, its kind first (the script is its only reader):

- `cw NODE_PORT CLIENT_PORT T LAST_ID`: at T the client began writing every frame
  with a request id up to LAST_ID (not written before) on its connection to the node
- `cr NODE_PORT CLIENT_PORT T ID...`: the client read the responses to those ids
- `nr NODE_PORT CLIENT_PORT T ID:LEDGER:ENTRY:COUNT...`: the node read those adds
  (T is when their bytes came off the socket)
- `jw T_FORMED T_WRITTEN LEDGER:ENTRY:COUNT...`: the journal formed a group of those
  runs and wrote it (not yet synced)
- `js T SYNC_NS LEDGER:ENTRY:COUNT...`: the group's fdatasync (SYNC_NS long) has
  ended and, every group before it synced too, it is handed to the ledgers at T
- `ns T LEDGER:ENTRY:COUNT...`: the node encoded the responses to those runs, to be
  written at once
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import trio

from netio.messages import AddBatch, AddRun

if TYPE_CHECKING:
    from journal.request import Request

__all__ = ["TRACE_ENV", "Tracer", "current", "disable", "enable", "runs_of"]

TRACE_ENV: Final = "PORA_TRACE_FILE"
#: records held before they are written out (the buffer's bound)
RECORDS_BUFFERED_MAX: Final = 4096


class Tracer:
    """One process's trace file and its bounded buffer of records."""

    def __init__(self, prefix: str) -> None:
        self.path = Path(f"{prefix}.{os.getpid()}")
        self._file = self.path.open("a", encoding="ascii")
        self._records: list[str] = []
        self._trio_offset: float | None = None

    def record(self, kind: str, *fields: object) -> None:
        self._records.append(" ".join([kind, *map(str, fields)]))
        if len(self._records) >= RECORDS_BUFFERED_MAX:
            self.flush()

    # --- the client (pora.client.connection) ---------------------------------------------

    def client_wrote(self, node_port: int, client_port: int, sent_ns: int, last_id: int) -> None:
        self.record("cw", node_port, client_port, sent_ns, last_id)

    def client_read(self, node_port: int, client_port: int, ids: Iterable[int]) -> None:
        self.record("cr", node_port, client_port, time.monotonic_ns(), *ids)

    # --- the node (pora.server, journal through pora.node) -------------------------------

    def node_read(
        self, node_port: int, client_port: int, received_at: float, requests: Iterable[object]
    ) -> None:
        """Adds read; `received_at` is when their bytes came in, on trio's clock."""
        received_ns = round((received_at + self._trio_clock_offset()) * 1e9)
        adds = []
        for request in requests:
            if type(request) is tuple:  # a WireAdd: (request_id, ledger_id, entry_id, ...)
                adds.append(f"{request[0]}:{request[1]}:{request[2]}:1")
            elif isinstance(request, AddRun):
                adds.append(
                    f"{request.request_id}:{request.ledger_id}:"
                    f"{request.first_entry_id}:{len(request.payloads)}"
                )
            elif isinstance(request, AddBatch):  # ids not consecutive
                adds += [
                    f"{request.request_id}:{request.ledger_id}:{entry_id}:1"
                    for entry_id in request.entry_ids
                ]
        if adds:
            self.record("nr", node_port, client_port, received_ns, *adds)

    def _trio_clock_offset(self) -> float:
        """What turns trio's clock (which the server keeps) into `time.monotonic`'s."""
        if self._trio_offset is None:
            self._trio_offset = time.monotonic() - trio.current_time()
        return self._trio_offset

    def group_written(self, group: Sequence[Request], formed_ns: int) -> None:
        self.record("jw", formed_ns, time.monotonic_ns(), *runs_of(group))

    def group_synced(self, group: Sequence[Request], sync_seconds: float) -> None:
        self.record("js", time.monotonic_ns(), round(sync_seconds * 1e9), *runs_of(group))

    def responses_encoded(self, requests: Sequence[Request]) -> None:
        self.record("ns", time.monotonic_ns(), *runs_of(requests))

    def flush(self) -> None:
        if self._records and not self._file.closed:
            self._file.write("\n".join(self._records) + "\n")
            self._file.flush()
        self._records.clear()

    def close(self) -> None:
        self.flush()
        self._file.close()


#: the process's tracer while tracing is on (at most one)
_active: list[Tracer] = []


def enable(prefix: str) -> Tracer:
    """Trace this process from now on to `<prefix>.<pid>` (objects made after this)."""
    if not _active:
        _active.append(Tracer(prefix))
        atexit.register(_active[0].close)
    return _active[0]


def disable() -> None:
    """Stop tracing (objects made before keep the tracer they took); flush and close."""
    if _active:
        _active.pop().close()


def current() -> Tracer | None:
    """The process's tracer, None when tracing is off."""
    return _active[0] if _active else None


def runs_of(requests: Iterable[Request]) -> list[str]:
    """`LEDGER:ENTRY:COUNT` of each journal request (a run of entries) given."""
    return [f"{r.ledger_id}:{r.entry_id}:{len(r.bodies)}" for r in requests]


if os.environ.get(TRACE_ENV):
    enable(os.environ[TRACE_ENV])
