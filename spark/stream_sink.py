"""Placeholder replaced by the writers' work in this session (docs/spark.md)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter

from spark.options import PoraOptions


class PoraStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: PoraOptions, schema: Any, overwrite: bool) -> None:
        raise NotImplementedError("writing a Pora stream from Spark")

    def write(self, iterator: Any) -> Any:
        raise NotImplementedError("writing a Pora stream from Spark")
