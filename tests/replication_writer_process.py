"""A writer process for tests/test_replication_processes.py, run with sys.executable:

    python replication_writer_process.py METADATA_URL LOG_FILE [TASKS [E,QW,QA [APPENDS]]]

Creates one ledger (by default E=3 Qw=3 Qa=2; password "pw") and appends from TASKS
asyncio tasks until it is killed or fenced; with APPENDS, the tasks stop after that
many appends in all and the writer idles, never telling the nodes its last LAC (a
writer killed then leaves every entry sent after the last LAC the nodes saw
acknowledged). Every line of LOG_FILE is written whole and flushed before the task
goes on, so a test that SIGKILLs or SIGSTOPs this process reads exactly what it
logged:

    ledger ID                  once, before the first append
    ack ENTRY_ID SHA256        an append acknowledged, with its payload's digest
    fenced pending TASK TYPE   an append in flight failed with LedgerFenced (TYPE: the
                               error's type, LedgerDeleted after a delete)
    fenced later TASK TYPE     the task's next append failed with LedgerFenced too
    error TASK TYPE MESSAGE    any other failure (a test fails on it)
    done                       every task ended (fenced or failed)
    idle                       APPENDS appends made; nothing more is sent
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from typing import TextIO

import pora
from pora.client.replication.config import ClientConfig

#: quorums the processes tests write with
ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
PASSWORD = "pw"


def log(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


async def append_until_fenced(
    ledger: pora.LedgerWriter, task: int, out: TextIO, budget: list[int] | None = None
) -> None:
    sequence = 0
    while True:
        if budget is not None:
            if budget[0] == 0:
                return
            budget[0] -= 1
        # payloads of varied sizes, unique per task and sequence
        payload = b"%d-%d-" % (task, sequence) + os.urandom(64 + (task * 37 + sequence) % 900)
        sequence += 1
        try:
            entry_id = await ledger.append(payload)
        except pora.LedgerFenced as fenced:
            log(out, f"fenced pending {task} {type(fenced).__name__}")
            break
        except Exception as error:  # the test fails on it, reading the log
            log(out, f"error {task} {type(error).__name__} {error}")
            return
        log(out, f"ack {entry_id} {hashlib.sha256(payload).hexdigest()}")
    try:
        entry_id = await ledger.append(b"after the fence")
    except pora.LedgerFenced as fenced:
        log(out, f"fenced later {task} {type(fenced).__name__}")
    except Exception as error:  # the test fails on it, reading the log
        log(out, f"error {task} {type(error).__name__} {error}")
    else:
        log(out, f"ack {entry_id} {hashlib.sha256(b'after the fence').hexdigest()}")


async def main(
    url: str,
    out: TextIO,
    tasks: int,
    quorums: tuple[int, int, int] = (ENSEMBLE, WRITE_QUORUM, ACK_QUORUM),
    appends: int | None = None,
) -> None:
    ensemble, write_quorum, ack_quorum = quorums
    # with a budget of appends, the idle writer never sends its LAC (R7)
    config = ClientConfig(lac_flush_interval_s=3600.0) if appends is not None else None
    budget = None if appends is None else [appends]
    async with pora.connect(url, config) as client:
        ledger = await client.create_ledger(
            ensemble_size=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            password=PASSWORD,
        )
        log(out, f"ledger {ledger.ledger_id}")
        await asyncio.gather(*(append_until_fenced(ledger, k, out, budget) for k in range(tasks)))
        if budget is not None:
            log(out, "idle")
            await asyncio.Event().wait()  # until killed
    log(out, "done")


if __name__ == "__main__":
    with open(sys.argv[2], "a", encoding="ascii") as log_file:
        tasks = int(sys.argv[3]) if len(sys.argv) > 3 else 64
        if len(sys.argv) > 4:
            e, qw, qa = (int(q) for q in sys.argv[4].split(","))
            appends = int(sys.argv[5]) if len(sys.argv) > 5 else None
            asyncio.run(main(sys.argv[1], log_file, tasks, (e, qw, qa), appends))
        else:
            asyncio.run(main(sys.argv[1], log_file, tasks))
