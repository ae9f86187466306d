"""A speculative attempt that loses: its writes happened (and may still be going on
when the driver commits), and Spark never reports it to `commit` or `abort`. The
commit makes only the reported segments visible and deletes the loser's ledger; the
loser's later appends fail; every row is in the stream once.

Spark never launches a speculative copy in local mode (no speculation scheduler, and
never a second attempt on the host of the first), so the race is played here with the
writer's own objects: the driver's writer, and two attempts of one partition in two
threads, the task identity Spark would give each in its place of the TaskContext. The
cluster and the stream are the real ones."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from spark_support import spark_cluster, stream_name
from spark_write_support import column, segment_ledgers, stream_ledgers

import pora
import spark.batch_writer
from spark.batch_writer import PoraBatchWriter
from spark.options import parse_options
from spark.task_writes import SegmentWritten

__all__ = ["spark_cluster"]

pytestmark = pytest.mark.slow

WAIT_S = 60.0


def rows(start: int, count: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": pa.array(range(start, start + count), pa.int64())})


def test_a_losing_attempts_ledger_is_deleted(
    spark_cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql.types import LongType, StructField, StructType  # noqa: PLC0415

    name = stream_name("speculation")
    options = parse_options({"metadata": spark_cluster, "rows_per_entry": "10"}, name)
    schema = StructType([StructField("id", LongType(), nullable=False)])
    driver = PoraBatchWriter(options, schema, overwrite=False)
    attempts = {"winner": (0, 0, 1), "loser": (0, 0, 0)}
    monkeypatch.setattr(
        spark.batch_writer, "task_identity", lambda: attempts[threading.current_thread().name]
    )
    loser_writing, commit_done = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def slow_rows() -> Iterator[pa.RecordBatch]:
        yield rows(0, 50)
        yield rows(50, 50)  # the first is appended once the second is asked for
        loser_writing.set()
        commit_done.wait(WAIT_S)
        yield rows(100, 50)

    def lose() -> None:
        try:
            outcome["loser"] = driver.write(slow_rows())
        except Exception as error:
            outcome["loser"] = error

    loser = threading.Thread(target=lose, name="loser")
    loser.start()
    try:
        assert loser_writing.wait(WAIT_S)
        winner: list[Any] = []
        thread = threading.Thread(
            target=lambda: winner.append(driver.write(iter([rows(0, 150)]))), name="winner"
        )
        thread.start()
        thread.join()
        assert isinstance(winner[0], SegmentWritten) and winner[0].rows == 150
        # the driver's commit runs on a pickled copy: rely on nothing else
        copy = pickle.loads(pickle.dumps(driver))
        copy.commit([winner[0]])
    finally:
        commit_done.set()
        loser.join()
    assert isinstance(outcome["loser"], pora.PoraError)  # its appends were refused
    assert sorted(column(spark_cluster, name, "id")) == list(range(150))
    assert stream_ledgers(spark_cluster, name) == segment_ledgers(spark_cluster, name)
