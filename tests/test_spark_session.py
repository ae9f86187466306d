"""The Spark the tests run is real and its Python workers run this interpreter, with
Pora importable: what every Spark test stands on."""

from __future__ import annotations

from typing import Any


def test_spark_workers_import_pora(spark_session: Any) -> None:
    def where(_: object) -> list[str]:
        import pora  # noqa: PLC0415
        import spark.encoding  # noqa: PLC0415 (in the worker)

        return [pora.__name__, spark.encoding.__name__]

    found = spark_session.sparkContext.parallelize(range(2), 2).flatMap(where).collect()
    assert found == ["pora", "spark.encoding"] * 2
