"""The README's Spark example: examples/spark_events.py, run as the README says (no
arguments, next to ./pora-cluster), writes a DataFrame into a stream on a real 3-node
`pora cluster` with df.write and foreachPartition, and reads it back batch and
streaming."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio
from spark_support import SPARK_TEST_JVM_OPTIONS
from test_cli_cluster import cluster

EXAMPLE = Path(__file__).parent.parent / "examples" / "spark_events.py"


@pytest.mark.slow
async def test_the_spark_example_writes_and_reads_a_stream(tmp_path: Path) -> None:
    async with cluster(tmp_path, 3) as running:
        await running.wait_for_line("ready: 3 nodes")
        (tmp_path / "pora-cluster").symlink_to(running.folder)
        # the JVM's options are the Spark tests' (spark_support.py), through the variable
        # every JVM reads: the example runs as the README says, only sooner
        jvm_options = f"{os.environ.get('JDK_JAVA_OPTIONS', '')} {SPARK_TEST_JVM_OPTIONS}"
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "JDK_JAVA_OPTIONS": jvm_options.strip(),
        }
        with trio.fail_after(180):
            result = await trio.run_process(
                [sys.executable, str(EXAMPLE)],
                cwd=tmp_path,
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    assert result.stdout.decode().splitlines() == [
        "batch: 1000 rows, sum(value) = 249750.0",
        "after foreachPartition: 2000 rows (the first DataFrame: 1000)",
        "streaming: 2000 rows",
    ]
