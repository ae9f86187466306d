"""A ledger recovery in a process of its own, for tests that SIGSTOP and SIGKILL it
part way (tests/test_recovery_processes.py), run with sys.executable:

    python recovery_process.py METADATA_URL LEDGER_ID NODE_TIMEOUT_S [STOP_AT]

Opens the ledger with recovery (password "pw"): fences it, recovers its tail, closes
it; prints `closed LAST_ENTRY_ID` when done. With STOP_AT, the recovery stops itself
(SIGSTOP) at that step, after printing `at STOP_AT`, for the test to SIGKILL it there:

    fenced     the fence covers the last ensemble; nothing read yet (R17)
    voted      the first window of the tail voted on; nothing re-added yet (R19)
    copied     the first window re-added to its write sets, more of the tail to go (R20)
    replaced   a member replaced and the record names the replacement; not closed (R20)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import pora
from pora.client.replication import recovery
from pora.client.replication.config import ClientConfig

PASSWORD = "pw"
#: the step -> the method of `Recovery` it follows
STEPS = {"fenced": "fence", "voted": "_vote_window", "copied": "copy", "replaced": "_commit"}


def stop_after(method: str, step: str) -> None:
    """Make the first return of `Recovery.<method>` stop this process."""
    original: Callable[..., Any] = getattr(recovery.Recovery, method)

    async def then_stop(self: recovery.Recovery, *args: object) -> object:
        result = await original(self, *args)
        print(f"at {step}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # the test kills the process here
        return result

    setattr(recovery.Recovery, method, then_stop)


async def main(url: str, ledger_id: int, node_timeout_s: float) -> None:
    async with pora.connect(url, ClientConfig(node_timeout_s=node_timeout_s)) as client:
        reader = await client.open_ledger(ledger_id, password=PASSWORD)
        print(f"closed {reader.last_entry_id}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 4:
        stop_after(STEPS[sys.argv[4]], sys.argv[4])
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
