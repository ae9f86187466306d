"""`Batch`: one ledger's entries for one node, `(entry_id, payload)` in increasing id
order, as a writer's pending adds cut them (`replication/core/pending_adds.py`) and
the node calls carry them (`node_calls.py`). A type only, so the pure room uses it.
"""

from __future__ import annotations

Batch = list[tuple[int, bytes]]

__all__ = ["Batch"]
