"""The Spark tests' shared parts: one SparkSession for the whole run (local mode, two
cores, a task tried up to four times so a test can fail first attempts), and one
3-node `pora cluster` of real `pora serve` processes its Python workers reach over
TCP, each test on streams of its own (`stream_name`). Spark starts once (some 6 s)
and the cluster once (some 3 s): the Spark tests stay within a few minutes.

    def test_it(spark_session: SparkSession, spark_cluster: str) -> None:
        df.write.format("pora").option("metadata", spark_cluster).save(stream_name())
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_process import pora_cluster_process

_names = itertools.count()

#: the JVM of the tests' Spark: its quick compiler only and the serial collector. The
#: tests' jobs are small and short, so the JVM's optimizing compiler costs more than
#: it gains (tests/test_spark_read.py: 48-55 s against 70-73 s, alternated, load 5-7)
SPARK_TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def stream_name(prefix: str = "spark") -> str:
    """A stream name no other test of this run uses."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """A local SparkSession (`local[2,4]`: 2 cores, 4 attempts per task), its Python
    workers on this interpreter (the one Pora is installed in)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession  # noqa: PLC0415 (a slow import, for Spark tests only)

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("pora-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.driver.extraJavaOptions", SPARK_TEST_JVM_OPTIONS)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The metadata URL of a 3-node local cluster (SQLite metadata) for the run."""
    folder = tmp_path_factory.mktemp("spark-cluster")
    with pora_cluster_process(folder, nodes=3) as url:
        yield url
