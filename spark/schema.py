"""The table schema a stream keeps in its attributes (docs/spark.md, "Encoding"):
Spark's JSON form (`SPARK_SCHEMA_KEY`, what a reader reports to Spark, nullability
included) beside Arrow's (`ARROW_SCHEMA_KEY`). Reading it here; writers record and
check it."""

from __future__ import annotations

import json
from typing import Any

from spark.encoding import SPARK_SCHEMA_KEY


class NoSchema(ValueError):
    """The stream has no table schema: no DataFrame was ever written to it."""


def spark_schema_of(stream: str, attributes: dict[str, str]) -> Any:
    """The stream's table schema as a pyspark StructType; NoSchema when it has none."""
    from pyspark.sql.types import StructType  # noqa: PLC0415 (only where Spark runs)

    text = attributes.get(SPARK_SCHEMA_KEY)
    if text is None:
        raise NoSchema(
            f"stream {stream!r} has no table schema: no DataFrame was written to it (a "
            "stream written by other clients reads through pora's stream.read())"
        )
    return StructType.fromJson(json.loads(text))
