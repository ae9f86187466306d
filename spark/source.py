"""`PoraDataSource`: the PySpark data source (short name "pora") over Pora streams,
batch and Structured Streaming, reading and writing (docs/spark.md). It only parses
the options and hands over to the reader and writer of each kind; Spark pickles it
to its Python workers, so it holds the options and nothing connected."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from spark.blocking import blocking_client
from spark.options import PoraOptions, parse_options
from spark.schema import check_read_schema, spark_schema_of


class PoraDataSource(DataSource):
    """`spark.dataSource.register(PoraDataSource)`, then `format("pora")` with
    `option("metadata", url)` and the stream's name as the path."""

    @classmethod
    def name(cls) -> str:
        return "pora"

    def _options(self) -> PoraOptions:
        return parse_options(self.options)

    def schema(self) -> Any:
        """The stream's table schema, from its attributes (no schema argument)."""
        options = self._options()
        with blocking_client(options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, options.stream)
            attributes = pora.call(stream.attributes)
        return spark_schema_of(options.stream, attributes)

    def _checked_read_schema(self, schema: Any) -> PoraOptions:
        """The options, once `schema` (the stream's, or one given with `.schema()`)
        reads the stream as recorded: a given one that names a column the stream
        lacks, another type or a non-nullable column would read nulls or casts
        silently (SchemaMismatch instead)."""
        options = self._options()
        with blocking_client(options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, options.stream)
            check_read_schema(options.stream, pora.call(stream.attributes), schema)
        return options

    def reader(self, schema: Any) -> DataSourceReader:
        from spark.batch_reader import PoraBatchReader  # noqa: PLC0415

        return PoraBatchReader(self._checked_read_schema(schema), schema)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        from spark.batch_writer import PoraBatchWriter  # noqa: PLC0415

        return PoraBatchWriter(self._options(), schema, overwrite)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802 (Spark's)
        from spark.stream_source import PoraStreamReader  # noqa: PLC0415

        return PoraStreamReader(self._checked_read_schema(schema), schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        from spark.stream_sink import PoraStreamWriter  # noqa: PLC0415

        return PoraStreamWriter(self._options(), schema, overwrite)
