"""A Spark write into a stream with E=3 Qw=3 Qa=2 while one node of the cluster is
SIGKILLed mid-write (a 3-node cluster: every segment's ensemble holds the dead node,
and no spare replaces it): the job succeeds with every row once, the appends acked by
the two live nodes and the commit recovering each segment from them. The tasks pause once their
segments hold rows (a marker file each) until the test has killed the node (a file it
writes), so the kill lands inside the writes, not before or after them."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from cluster_process import pora_cluster_process
from spark_support import spark_session, stream_name
from spark_write_support import segment_ledgers, ship_by_value, stream_ledgers, stream_table
from test_cli_cluster import node_pids

from spark import PoraDataSource

__all__ = ["spark_session"]

ship_by_value(__name__)

pytestmark = pytest.mark.slow

PAUSE_S_MAX = 60.0
PARTITIONS = 2


def pausing_once(folder: str) -> Any:
    """Batches through; on each partition's first attempt, after its first batches,
    a marker file and a wait for the test's "killed" file."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext  # noqa: PLC0415

        context = TaskContext.get()
        assert context is not None
        for index, batch in enumerate(batches):
            yield batch
            if index == 1 and context.attemptNumber() == 0:
                Path(folder, f"writing-{context.partitionId()}").touch()
                deadline = time.monotonic() + PAUSE_S_MAX
                while not Path(folder, "killed").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)

    return run


def wait_for(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not true within {timeout_s} s"
        time.sleep(0.02)


def test_a_node_killed_during_a_write(spark_session: Any, tmp_path: Path) -> None:
    spark_session.dataSource.register(PoraDataSource)
    signals = tmp_path / "signals"
    signals.mkdir()
    name = stream_name("killed")
    with pora_cluster_process(tmp_path / "cluster", nodes=3) as url:
        df = spark_session.range(0, 6000, 1, PARTITIONS).selectExpr(
            "id", "repeat('x', 200) as body"
        )
        killed: list[int] = []

        def kill_once_writing() -> None:
            """In the background: once every task is inside its write, a node dies."""
            try:
                wait_for(
                    lambda: all((signals / f"writing-{p}").exists() for p in range(PARTITIONS)),
                    PAUSE_S_MAX,
                )
                pid = node_pids(tmp_path / "cluster")[1]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            finally:
                (signals / "killed").touch()

        killer = threading.Thread(target=kill_once_writing)
        killer.start()
        spark_session.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        try:
            (
                df.mapInArrow(pausing_once(str(signals)), df.schema)
                .write.format("pora")
                .option("metadata", url)
                .option("rows_per_entry", "100")
                .option("ensemble_size", "3")
                .option("write_quorum", "3")
                .option("ack_quorum", "2")
                .mode("append")
                .save(name)
            )
        finally:
            (signals / "killed").touch()
            killer.join()
            spark_session.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        assert killed
        table = stream_table(url, name)
        assert sorted(table.column("id").to_pylist()) == list(range(6000))
        assert stream_ledgers(url, name) == segment_ledgers(url, name)
