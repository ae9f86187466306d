"""The schema checks on their own (no Spark job): the differences named field by
field, nullability inside a nested type shown, what merge_schema widens, and how a
schema given to a reader may differ from the stream's (a projection, not more)."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark.schema import merged_schema, read_schema_differences, schema_differences

RECORDED = StructType(
    [
        StructField("id", LongType(), nullable=False),
        StructField("tags", ArrayType(StringType(), containsNull=False)),
    ]
)


def test_differences_are_named_by_field() -> None:
    given = StructType(
        [
            StructField("id", IntegerType(), nullable=False),
            StructField("extra", StringType()),
        ]
    )
    assert schema_differences(RECORDED, given) == [
        "'tags' missing",
        "'id' type int, the stream's is bigint",
        "'extra' added (string, nullable)",
    ]
    # order does not matter; non-null rows fit a nullable field
    same = StructType([StructField("tags", ArrayType(StringType(), False), False), RECORDED["id"]])
    assert schema_differences(RECORDED, same) == []
    nullable_id = StructType([StructField("id", LongType()), RECORDED["tags"]])
    assert schema_differences(RECORDED, nullable_id) == ["'id' nullable, the stream's is not"]


def test_nullability_inside_a_type_is_shown() -> None:
    given = StructType([RECORDED["id"], StructField("tags", ArrayType(StringType(), True))])
    (difference,) = schema_differences(RECORDED, given)
    assert '"containsNull":true' in difference and '"containsNull":false' in difference


def test_merge_widens_with_added_nullable_fields_only() -> None:
    wider = StructType([*RECORDED.fields, StructField("note", StringType())])
    assert merged_schema(RECORDED, wider) == wider
    not_null = StructType([*RECORDED.fields, StructField("note", StringType(), False)])
    assert merged_schema(RECORDED, not_null) is None
    retyped = StructType(
        [StructField("id", StringType()), RECORDED["tags"], StructField("note", StringType())]
    )
    assert merged_schema(RECORDED, retyped) is None


def test_a_reader_takes_a_projection_of_the_streams_schema_only() -> None:
    tags = StructField("tags", ArrayType(StringType(), containsNull=False))
    assert read_schema_differences(RECORDED, StructType([tags])) == []
    given = StructType(
        [
            StructField("tags", ArrayType(StringType(), containsNull=True)),
            StructField("id", LongType(), nullable=False),
            StructField("extra", StringType()),
        ]
    )
    loose = StructType([StructField("id", LongType(), nullable=True)])
    assert read_schema_differences(RECORDED, loose) == []  # nullable reads non-null
    strict_tags = ArrayType(StringType(), containsNull=False)
    strict = StructType([StructField("tags", strict_tags, nullable=False)])
    assert read_schema_differences(RECORDED, strict) == ["'tags' not nullable, the stream's is"]
    assert read_schema_differences(RECORDED, given) == [
        "'tags' type "
        '{"containsNull":true,"elementType":"string","type":"array"}, the stream\'s is '
        '{"containsNull":false,"elementType":"string","type":"array"}',
        "'extra' is not a column of the stream",
    ]
