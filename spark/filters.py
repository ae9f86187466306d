"""Filter pushdown (docs/spark.md, "Pushdown"): the Spark filters a reader can
evaluate exactly on Arrow batches with pyarrow.compute, as one expression, and the
ones it leaves to Spark.

Pushed filters are not evaluated again by Spark, so only those whose Arrow meaning
is Spark's are taken: comparisons, IN and the string predicates on top-level
integer, string, boolean and date columns, IS [NOT] NULL on any top-level column,
and NOT of these. Floating point is left out (Spark orders NaN above every number
and equal to itself, Arrow compares it false), and so are decimals and timestamps
(their literals' exact Arrow types depend on precision and time zone)."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.compute as pc
from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

_COMPARABLE = (ByteType, ShortType, IntegerType, LongType, StringType, BooleanType, DateType)
_COMPARISONS: dict[type, Callable[[Any, Any], Any]] = {
    EqualTo: lambda column, value: column == value,
    GreaterThan: lambda column, value: column > value,
    GreaterThanOrEqual: lambda column, value: column >= value,
    LessThan: lambda column, value: column < value,
    LessThanOrEqual: lambda column, value: column <= value,
}
_STRING_MATCHES: dict[type, Callable[[Any, str], Any]] = {
    StringStartsWith: pc.starts_with,
    StringEndsWith: pc.ends_with,
    StringContains: pc.match_substring,
}


def _literal_fits(data_type: DataType, value: object) -> bool:
    """Whether `value` is a literal of the column's own kind (no cross-type rules)."""
    if isinstance(data_type, BooleanType):
        return isinstance(value, bool)
    if isinstance(data_type, StringType):
        return isinstance(value, str)
    if isinstance(data_type, DateType):
        return isinstance(value, datetime.date) and not isinstance(value, datetime.datetime)
    return isinstance(value, int) and not isinstance(value, bool)


def to_expression(schema: StructType, spark_filter: Filter) -> pc.Expression | None:
    """The filter as an Arrow expression with Spark's meaning; None when it is not one
    this reader evaluates exactly."""
    if isinstance(spark_filter, Not):
        inner = to_expression(schema, spark_filter.child)
        return None if inner is None else ~inner
    path: tuple[str, ...] = getattr(spark_filter, "attribute", ())
    if len(path) != 1 or path[0] not in schema.names:
        return None  # nested fields are left to Spark
    column = pc.field(path[0])
    if isinstance(spark_filter, IsNull):
        return column.is_null()
    if isinstance(spark_filter, IsNotNull):
        return column.is_valid()
    return _value_expression(schema[path[0]].dataType, column, spark_filter)


def _value_expression(
    data_type: DataType, column: pc.Expression, spark_filter: Filter
) -> pc.Expression | None:
    """A filter comparing the column with literals, when its type and theirs allow."""
    if not isinstance(data_type, _COMPARABLE):
        return None
    value = getattr(spark_filter, "value", None)
    kind = type(spark_filter)
    if kind in _COMPARISONS and _literal_fits(data_type, value):
        return _COMPARISONS[kind](column, value)
    if kind is In:
        values = list(value or ())
        fits = values and all(_literal_fits(data_type, item) for item in values)
        return column.isin(values) if fits else None
    if kind in _STRING_MATCHES and isinstance(data_type, StringType) and isinstance(value, str):
        return _STRING_MATCHES[kind](column, value)
    return None


def split_filters(
    schema: StructType, filters: Sequence[Filter]
) -> tuple[pc.Expression | None, list[Filter]]:
    """The AND of the filters this reader evaluates (None: none), and the rest."""
    pushed: pc.Expression | None = None
    rest: list[Filter] = []
    for spark_filter in filters:
        expression = to_expression(schema, spark_filter)
        if expression is None:
            rest.append(spark_filter)
        else:
            pushed = expression if pushed is None else pushed & expression
    return pushed, rest
