"""Write a DataFrame into a stream on the local cluster with Spark, exactly once, and
read it back: batch, through `foreachPartition`, and as a streaming query.

    bash scripts/cluster.sh                        # one terminal: 3 nodes
    .venv/bin/python examples/spark_events.py      # another, from the same folder

Needs the `spark` extra (scripts/test.sh installs it) and Java 17. Pass the metadata
URL `pora cluster` printed to use another cluster. Each run writes a new stream.
"""

from __future__ import annotations

import sys
import tempfile
import uuid

from pyspark.sql import SparkSession
from pyspark.sql import functions as fn

from spark import PoraDataSource, partition_writer


def main(url: str) -> None:
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(PoraDataSource)
    events = f"demo-events-{uuid.uuid4().hex[:8]}"
    df = spark.range(1000).select(
        fn.col("id"),
        (fn.col("id") % 7).cast("string").alias("key"),
        (fn.col("id") * 0.5).alias("value"),
    )
    # one job, one commit: every row once, however Spark retries its tasks
    df.write.format("pora").option("metadata", url).mode("append").save(events)
    back = spark.read.format("pora").option("metadata", url).load(events)
    total = back.agg(fn.sum("value")).collect()[0][0]
    print(f"batch: {back.count()} rows, sum(value) = {total}")
    # foreachPartition: each partition commits once under (job, partition)
    df.foreachPartition(partition_writer(url, events, schema=df.schema))
    # a loaded DataFrame keeps the commit it was planned at: load again for later ones
    again = spark.read.format("pora").option("metadata", url).load(events)
    print(f"after foreachPartition: {again.count()} rows (the first DataFrame: {back.count()})")
    # a streaming query from the beginning of the stream, to the end as of now
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            spark.readStream.format("pora")
            .option("metadata", url)
            .load(events)
            .writeStream.format("memory")
            .queryName("demo")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    print(f"streaming: {spark.table('demo').count()} rows")
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:pora-cluster/meta.db")
