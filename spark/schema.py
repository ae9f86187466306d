"""The table schema a stream keeps in its attributes (docs/spark.md, "Encoding" and
"Schema"): Spark's JSON form (`SPARK_SCHEMA_KEY`, what a reader reports to Spark,
nullability included) beside Arrow's (`ARROW_SCHEMA_KEY`). Readers read it here;
writers record it on their first write and check every later write against it (by
column name: the order of the columns does not matter), widening it with added
nullable columns when asked to (`merge_schema`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pora import AttributesChanged
from spark.encoding import ARROW_SCHEMA_KEY, SPARK_SCHEMA_KEY, schema_to_attribute

if TYPE_CHECKING:
    import pyarrow as pa

    from pora import Stream
    from spark.blocking import BlockingClient

#: a writer racing others that change the schema gives up after this many re-reads
_RECORD_TRIES_MAX = 20


class NoSchema(ValueError):
    """The stream has no table schema: no DataFrame was ever written to it."""


class SchemaMismatch(ValueError):
    """Rows whose schema is not the stream's: says which fields differ and how."""


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


def arrow_schema_of(schema: Any) -> pa.Schema:
    """The Arrow schema Spark hands a writer's tasks the rows of `schema` in
    (pyspark's own conversion; timestamps with a time zone in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema  # noqa: PLC0415

    return to_arrow_schema(schema, timezone="UTC")


def schema_attributes(schema: Any) -> dict[str, str]:
    """The stream attributes that record `schema` (a StructType)."""
    return {
        SPARK_SCHEMA_KEY: schema.json(),
        ARROW_SCHEMA_KEY: schema_to_attribute(arrow_schema_of(schema)),
    }


def schema_differences(recorded: Any, given: Any) -> list[str]:
    """How `given` (the rows') differs from `recorded` (the stream's), field by field
    and by name: a field missing from the rows, one added, one of another type, one
    nullable where the stream's is not. Empty when the rows fit the stream (a field
    that is never null in the rows fits a nullable one)."""
    ours = {field.name: field for field in recorded.fields}
    theirs = {field.name: field for field in given.fields}
    differences = [f"{name!r} missing" for name in ours if name not in theirs]
    for field in theirs.values():
        difference = _field_difference(ours.get(field.name), field, reading=False)
        if difference is not None:
            differences.append(difference)
    return differences


def read_schema_differences(recorded: Any, given: Any) -> list[str]:
    """How a schema given to a reader (`.schema(...)`) differs from the stream's: a
    field the stream lacks, one of another type, one not nullable where the stream's
    is. Fields it leaves out, and its order, are no difference (Spark reads those
    columns by name, as a projection)."""
    ours = {field.name: field for field in recorded.fields}
    differences = [
        _field_difference(ours.get(field.name), field, reading=True) for field in given.fields
    ]
    return [difference for difference in differences if difference is not None]


def _field_difference(kept: Any, field: Any, reading: bool) -> str | None:
    """How `field` (the rows' when writing, a reader's when `reading`) differs from
    the stream's field of its name, `kept` (None: the stream has none). Nullability:
    rows may not bring nulls into a non-nullable field; a reader may not declare a
    nullable one non-nullable."""
    name = field.name
    if kept is None:
        if reading:
            return f"{name!r} is not a column of the stream"
        nullable = "nullable" if field.nullable else "not nullable"
        return f"{name!r} added ({field.dataType.simpleString()}, {nullable})"
    if kept.dataType != field.dataType:
        ours_shown, theirs_shown = kept.dataType.simpleString(), field.dataType.simpleString()
        if ours_shown == theirs_shown:  # differs only in nullability inside
            ours_shown, theirs_shown = kept.dataType.json(), field.dataType.json()
        return f"{name!r} type {theirs_shown}, the stream's is {ours_shown}"
    if reading and kept.nullable and not field.nullable:
        return f"{name!r} not nullable, the stream's is"
    if not reading and field.nullable and not kept.nullable:
        return f"{name!r} nullable, the stream's is not"
    return None


def check_read_schema(stream: str, attributes: dict[str, str], given: Any) -> None:
    """SchemaMismatch when `given` (the schema a reader was handed) does not read
    the stream as recorded (see read_schema_differences)."""
    differences = read_schema_differences(spark_schema_of(stream, attributes), given)
    if differences:
        raise SchemaMismatch(
            f"the schema given to the reader is not stream {stream!r}'s: "
            f"{'; '.join(differences)}. Leave .schema(...) out: the reader takes the "
            "stream's own (then select, rename or cast columns on the DataFrame)"
        )


def merged_schema(recorded: Any, given: Any) -> Any | None:
    """`recorded` widened with the nullable fields `given` adds, when that is all that
    differs; None otherwise."""
    from pyspark.sql.types import StructType  # noqa: PLC0415

    names = set(recorded.fieldNames())
    added = [field for field in given.fields if field.name not in names]
    widened = StructType([*recorded.fields, *added])
    if not added or not all(field.nullable for field in added):
        return None
    return widened if not schema_differences(widened, given) else None


def record_schema(pora: BlockingClient, stream: Stream, schema: Any, merge: bool) -> Any:
    """Check `schema` (the rows' StructType) against the stream's and return the
    stream's after: recorded on the first write (compare-and-set on its absence),
    widened with added nullable columns when `merge` (compare-and-set on the old
    values); a writer that loses such a race reads again and decides again.
    SchemaMismatch naming the fields that differ otherwise."""
    for _ in range(_RECORD_TRIES_MAX):
        attributes = pora.call(stream.attributes)
        text = attributes.get(SPARK_SCHEMA_KEY)
        expected = {SPARK_SCHEMA_KEY: text, ARROW_SCHEMA_KEY: attributes.get(ARROW_SCHEMA_KEY)}
        if text is None:
            wanted = schema
        else:
            recorded = spark_schema_of(stream.name, attributes)
            differences = schema_differences(recorded, schema)
            if not differences:
                return recorded
            wanted = merged_schema(recorded, schema) if merge else None
            if wanted is None:
                raise SchemaMismatch(_mismatch(stream.name, differences, merge))
        try:
            pora.call(stream.set_attributes, schema_attributes(wanted), expected)
        except AttributesChanged:
            continue  # another writer recorded or widened it first: decide on theirs
        return wanted
    raise SchemaMismatch(
        f"stream {stream.name!r}: its schema changed under this writer "
        f"{_RECORD_TRIES_MAX} times in a row; run the job again"
    )


def _mismatch(stream: str, differences: list[str], merge: bool) -> str:
    hint = (
        "only added nullable columns widen the stream's schema"
        if merge
        else 'option("merge_schema", "true") widens it with added nullable columns'
    )
    return (
        f"the rows' schema is not stream {stream!r}'s: {'; '.join(differences)}. Write "
        f"rows of the stream's schema (reader: spark.read.format('pora')...load("
        f"{stream!r}).schema), or a stream of its own; {hint}"
    )
