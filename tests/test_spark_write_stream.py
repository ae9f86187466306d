"""The Pora streaming sink on real Structured Streaming (`local[2,4]`): each
micro-batch committed once under (query id, batch id), and a batch replayed after a
restart whose checkpoint lacks its commit (a driver that died between our commit and
Spark's commit log) changes nothing: every row once, the replay's ledgers deleted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from spark_support import spark_cluster, spark_session, stream_name
from spark_write_support import (
    column,
    pending_transactions,
    segment_ledgers,
    stream_ledgers,
)

from spark import PoraDataSource
from spark.blocking import blocking_client

__all__ = ["spark_cluster", "spark_session"]

pytestmark = pytest.mark.slow


def add_file(folder: Path, number: int, ids: range) -> None:
    lines = [json.dumps({"id": i, "key": f"k{i}"}) for i in ids]
    (folder / f"part-{number:03d}.json").write_text("\n".join(lines) + "\n")


def run_query(session: Any, url: str, name: str, source: Path, checkpoint: Path) -> list[int]:
    """Every file not yet processed, one micro-batch per file, then stop; the ids of
    the batches run."""
    query = (
        session.readStream.schema("id long, key string")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("pora")
        .option("metadata", url)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(name)
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return sorted({progress.batchId for progress in query.recentProgress})


def app_versions(url: str, name: str) -> int:
    with blocking_client(url) as pora:
        stream = pora.call(pora.client.open_stream, name)
        return int(pora.call(stream.info).commit)


def test_a_replayed_batch_commits_once(
    spark_session: Any, spark_cluster: str, tmp_path: Path
) -> None:
    spark_session.dataSource.register(PoraDataSource)
    name = stream_name("sink")
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    add_file(source, 0, range(0, 30))
    add_file(source, 1, range(30, 50))
    assert run_query(spark_session, spark_cluster, name, source, checkpoint) == [0, 1]
    assert sorted(column(spark_cluster, name, "id")) == list(range(50))
    commits = app_versions(spark_cluster, name)
    assert commits == 2  # one commit per batch
    # the driver "died" after our commit of batch 1 but before Spark logged it
    for log in ("1", ".1.crc"):
        (checkpoint / "commits" / log).unlink(missing_ok=True)
    add_file(source, 2, range(50, 60))
    assert run_query(spark_session, spark_cluster, name, source, checkpoint) == [1, 2]
    assert sorted(column(spark_cluster, name, "id")) == list(range(60))
    assert app_versions(spark_cluster, name) == commits + 1  # batch 2 only
    assert stream_ledgers(spark_cluster, name) == segment_ledgers(spark_cluster, name)
    assert pending_transactions(spark_cluster, name) == 0
