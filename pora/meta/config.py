"""How a metadata store behaves: `MetadataConfig`, the same for every backend.

Its own module, below the backends and `open_metadata` (backends.py), which all
read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pora.meta.records import RECORD_BYTES_MAX

DEFAULT_LEASE_S = 5.0
DEFAULT_SESSION_TIMEOUT_S = 6.0


@dataclass(frozen=True)
class MetadataConfig:
    call_timeout_s: float = 10.0
    record_bytes_max: int = RECORD_BYTES_MAX
    #: ledger ids a process reserves with one transaction and hands out from memory
    id_block_size: int = 100
    watch_poll_min_s: float = 0.01
    watch_poll_max_s: float = 0.5
    #: worker threads (and SQLite connections) a store uses at most
    threads_max: int = 4
    #: ZooKeeper: the session timeout asked for (the server bounds it); a node's
    #: registration disappears this long after its process stops answering
    session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S
    #: SQLite: writes queued for the writer thread's next transactions at most;
    #: callers wait for room (within their call timeout)
    write_queue_max: int = 1024
