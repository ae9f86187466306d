"""A process running stream transactions for tests/test_stream_transactions_processes.py,
run with sys.executable:

    python stream_transaction_process.py METADATA_URL STREAM LOG_FILE NAME COUNT

Runs COUNT transactions one after another, each with two segments of three entries
(payload "NAME.I.SEGMENT.ENTRY"). Transaction I aborts when I % 3 == 2 (an exception
in its block); the others commit with key "NAME.I", and then a second transaction
with the same key and one segment (payload "NAME.I.dup") commits again (changing
nothing). Every line of LOG_FILE is written whole and flushed:

    commit KEY COMMIT          the first commit with KEY applied as COMMIT
    again KEY COMMIT LEDGER    the second returned COMMIT; its segment's ledger LEDGER
    aborted NAME.I LEDGER...   the transaction aborted; its segments' ledgers
    error TYPE MESSAGE         anything else (the test fails on it)
    done
"""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

import pora


class JobFailed(Exception):
    pass


def log(out: TextIO, line: str) -> None:
    out.write(line + "\n")
    out.flush()


async def fill_and_fail(txn: pora.Transaction, prefix: str, ledgers: list[int]) -> None:
    ledgers.extend(await fill(txn, prefix))
    raise JobFailed(prefix)


async def fill(txn: pora.Transaction, prefix: str) -> list[int]:
    ledgers = []
    for s in range(2):
        segment = await txn.open_segment()
        ledgers.append(segment.ledger_id)
        await segment.append_many([f"{prefix}.{s}.{e}".encode() for e in range(3)])
    return ledgers


async def run(stream: pora.Stream, name: str, count: int, out: TextIO) -> None:
    for i in range(count):
        prefix = f"{name}.{i}"
        if i % 3 == 2:
            ledgers: list[int] = []
            try:
                async with stream.begin() as txn:
                    await fill_and_fail(txn, prefix, ledgers)
            except JobFailed:
                log(out, f"aborted {prefix} " + " ".join(map(str, ledgers)))
            continue
        async with stream.begin() as txn:
            await fill(txn, prefix)
            log(out, f"commit {prefix} {await txn.commit(key=prefix)}")
        async with stream.begin() as again:
            segment = await again.open_segment()
            await segment.append(f"{prefix}.dup".encode())
            log(out, f"again {prefix} {await again.commit(key=prefix)} {segment.ledger_id}")


async def main(url: str, stream_name: str, out: TextIO, name: str, count: int) -> None:
    try:
        async with pora.connect(url) as client:
            await run(await client.open_stream(stream_name), name, count, out)
    except Exception as error:  # the test fails on it, reading the log
        log(out, f"error {type(error).__name__} {error}")
        return
    log(out, "done")


if __name__ == "__main__":
    with open(sys.argv[3], "a", encoding="ascii") as log_file:
        asyncio.run(main(sys.argv[1], sys.argv[2], log_file, sys.argv[4], int(sys.argv[5])))
