"""scripts/trace_append.py, the count behind docs/architecture.md's walk of the write
path: it follows one append from the application to the journal's fdatasync on the
nodes and back, and counts what it passed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "trace_append.py"


def test_the_trace_follows_an_append_to_the_fdatasync_and_back() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    report = json.loads(result.stdout)
    walk = [(step["module"], step["function"]) for step in report["walk"]]
    assert walk[0] == ("pora/client/replication/writer.py", "LedgerWriter.append")
    # the client, the server, the journal on each node and the ledger worker take part
    synced = walk.index(("os", "fdatasync"))
    for step in [
        ("pora/server/reader.py", "RequestReader._read_loop"),
        ("journal/task.py", "Journal._commit"),
    ]:
        assert walk.index(step) < synced
    acknowledged = walk.index(
        ("pora/client/replication/writer.py", "LedgerWriter.appends_acknowledged")
    )
    assert synced < walk.index(("ledger/worker.py", "LedgerWorker._apply")) < acknowledged
    # an ack quorum of 2: the append returns once two of the three nodes synced
    assert walk[:acknowledged].count(("os", "fdatasync")) >= 2
    modules = {module for module, _ in walk if module != "os"}
    assert report["modules"] == len(modules)
    assert report["functions"] == len([step for step in walk if step[0] != "os"])
