"""The schema checks on their own (no Spark job): the differences named field by
field, nullability inside a nested type shown, and what merge_schema widens."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark.schema import merged_schema, schema_differences

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
