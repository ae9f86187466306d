"""Pora's PySpark pipeline (docs/spark.md): `PoraDataSource`, the data source "pora"
(batch and Structured Streaming, reading and writing), and `partition_writer`, the
exactly-once writer for `DataFrame.foreachPartition`. Needs the `spark` extra."""

from spark.partition_writer import partition_writer
from spark.source import PoraDataSource

__all__ = ["PoraDataSource", "partition_writer"]
