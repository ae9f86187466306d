"""Placeholder replaced by the readers' work in this session (docs/spark.md)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSourceReader

from spark.options import PoraOptions


class PoraBatchReader(DataSourceReader):
    def __init__(self, options: PoraOptions, schema: Any) -> None:
        raise NotImplementedError("reading a Pora stream from Spark")

    def read(self, partition: Any) -> Any:
        raise NotImplementedError("reading a Pora stream from Spark")
