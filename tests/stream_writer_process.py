"""A stream writer process for tests/test_stream_processes.py, run with
sys.executable:

    python stream_writer_process.py METADATA_URL STREAM LOG_FILE TASKS

Opens the stream's live writer (taking the stream over) and appends from TASKS
asyncio tasks until it is killed or fenced. Every line of LOG_FILE is written whole
and flushed before the task goes on, so a test that SIGKILLs or SIGSTOPs this
process reads exactly what it logged:

    open EPOCH                 the writer took the stream over
    ack POSITION SHA256        an append acknowledged: its position and payload digest
    fenced TASK TYPE           an append failed with WriterFenced (TYPE: its type)
    deleted TASK TYPE          an append failed with LedgerDeleted (the segment's
                               ledger deleted outside the stream)
    error TASK TYPE MESSAGE    any other failure (a test fails on it)
    done                       every task ended
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from typing import TextIO

import pora
from pora.streams.writer import StreamWriter


def log(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


async def append_until_fenced(writer: StreamWriter, task: int, out: TextIO) -> None:
    sequence = 0
    while True:
        payload = b"%d-%d-" % (task, sequence) + os.urandom(64 + (task * 37 + sequence) % 900)
        sequence += 1
        try:
            position = await writer.append(payload)
        except pora.WriterFenced as fenced:
            log(out, f"fenced {task} {type(fenced).__name__}")
            return
        except pora.LedgerDeleted as deleted:
            log(out, f"deleted {task} {type(deleted).__name__}")
            return
        except Exception as error:  # the test fails on it, reading the log
            log(out, f"error {task} {type(error).__name__} {error}")
            return
        log(out, f"ack {position} {hashlib.sha256(payload).hexdigest()}")


async def main(url: str, name: str, out: TextIO, tasks: int) -> None:
    async with pora.connect(url) as client:
        stream = await client.open_stream(name)
        async with stream.open_writer() as writer:
            log(out, f"open {writer.epoch}")
            await asyncio.gather(*(append_until_fenced(writer, k, out) for k in range(tasks)))
    log(out, "done")


if __name__ == "__main__":
    with open(sys.argv[3], "a", encoding="ascii") as log_file:
        asyncio.run(main(sys.argv[1], sys.argv[2], log_file, int(sys.argv[4])))
