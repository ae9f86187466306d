"""The Pora data source's options parsed on the driver: a malformed value fails at
once, naming the option as the user spelled it and the values it takes (not every
attempt of every task, nor a zstd error from inside a task)."""

from __future__ import annotations

import pytest

from spark.options import PoraOptionError, parse_options

URL = "sqlite:///nowhere.db"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("entry_bytes", "0", "option entry_bytes='0' must be at least 1"),
        ("rows_per_entry", "-5", "option rows_per_entry='-5' must be at least 1"),
        ("compression_level", "99", "option compression_level='99' must be from -7 to 22"),
        ("maxRecordsPerTrigger", "0", "option maxRecordsPerTrigger='0' must be at least 1"),
        ("maxBytesPerTrigger", "-1", "option maxBytesPerTrigger='-1' must be at least 1"),
        ("as_of_commit", "-1", "option as_of_commit='-1' must be at least 0"),
        ("partition_bytes", "0", "option partition_bytes='0' must be at least 1"),
        ("segment_bytes_max", "1000", "option segment_bytes_max='1000' must be at least 65536"),
        ("ensemble_size", "0", "option ensemble_size='0' must be at least 1"),
        ("Entry_Bytes", "1MiB", "option Entry_Bytes='1MiB' must be an integer, at least 1"),
        ("failOnDataLoss", "maybe", "option failOnDataLoss='maybe' must be true or false"),
    ],
)
def test_a_malformed_option_is_refused_by_name(key: str, value: str, message: str) -> None:
    with pytest.raises(PoraOptionError) as raised:
        parse_options({"metadata": URL, key: value}, "events")
    assert str(raised.value) == message


def test_the_bounds_themselves_are_taken() -> None:
    options = parse_options(
        {
            "metadata": URL,
            "compression_level": "-7",
            "rows_per_entry": "1",
            "as_of_commit": "0",
            "maxRecordsPerTrigger": "1",
            "segment_bytes_max": str(64 << 10),
        },
        "events",
    )
    assert options.compression_level == -7 and options.max_records_per_trigger == 1
    assert parse_options({"metadata": URL, "compression_level": "22"}, "e").compression_level == 22
