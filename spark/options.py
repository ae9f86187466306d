"""The options of the Pora data source and `partition_writer` (docs/spark.md,
"Options"), parsed once from Spark's strings into typed values, with a clear error
naming the option for a bad one. Spark's own option names (`maxRecordsPerTrigger`,
`failOnDataLoss`) keep their spelling; Pora's follow the client's keywords. Spark
passes option names in any case: they are looked up without it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spark.encoding import COMPRESSION_LEVEL_DEFAULT, ENTRY_BYTES_DEFAULT


class PoraOptionError(ValueError):
    """An option of the Pora data source that is missing or malformed."""


@dataclass(frozen=True)
class PoraOptions:
    #: the metadata store's URL (`pora.connect`'s)
    metadata: str
    #: the stream: `.load(name)` / `.save(name)` / `.start(name)`, or option "stream"
    stream: str
    # a new stream's quorums (a stream that exists keeps its own)
    ensemble_size: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    segment_bytes_max: int = 256 << 20
    # encoding
    entry_bytes: int = ENTRY_BYTES_DEFAULT
    compression_level: int = COMPRESSION_LEVEL_DEFAULT
    rows_per_entry: int | None = None
    #: appending rows whose schema adds nullable columns widens the stream's schema
    merge_schema: bool = False
    # reading
    as_of_commit: int | None = None
    #: payload bytes per input partition of a read (a segment is cut into ranges)
    partition_bytes: int = 32 << 20
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    #: where a streaming query starts without a checkpoint: "earliest" or "latest"
    starting_position: str = "earliest"
    #: the durable stream cursor a streaming query advances as it commits (None: one
    #: named when the query starts, kept in its offsets)
    cursor: str | None = None


_INT_OPTIONS = {
    "ensemble_size": "ensemble_size",
    "write_quorum": "write_quorum",
    "ack_quorum": "ack_quorum",
    "segment_bytes_max": "segment_bytes_max",
    "entry_bytes": "entry_bytes",
    "compression_level": "compression_level",
    "rows_per_entry": "rows_per_entry",
    "as_of_commit": "as_of_commit",
    "partition_bytes": "partition_bytes",
    "maxrecordspertrigger": "max_records_per_trigger",
    "maxbytespertrigger": "max_bytes_per_trigger",
}
#: each integer option's range (by field name; checked when the options are parsed,
#: on the driver, rather than failing every attempt of every task)
_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "ensemble_size": (1, 2**31 - 1),
    "write_quorum": (1, 2**31 - 1),
    "ack_quorum": (1, 2**31 - 1),
    "segment_bytes_max": (64 << 10, 2**63 - 1),
    "entry_bytes": (1, 2**63 - 1),
    "compression_level": (-7, 22),
    "rows_per_entry": (1, 2**63 - 1),
    "as_of_commit": (0, 2**63 - 1),
    "partition_bytes": (1, 2**63 - 1),
    "max_records_per_trigger": (1, 2**63 - 1),
    "max_bytes_per_trigger": (1, 2**63 - 1),
}
_BOOL_OPTIONS = {"merge_schema": "merge_schema", "failondataloss": "fail_on_data_loss"}
_STRING_OPTIONS = {"starting_position": "starting_position", "cursor": "cursor"}
#: options Spark itself sets or reads, passed through to us and ignored here
_SPARK_OPTIONS = {"path", "stream", "metadata", "checkpointlocation", "queryname"}


def parse_options(options: Mapping[str, str], stream: str | None = None) -> PoraOptions:
    """The typed options; PoraOptionError naming the first bad or unknown one."""
    lowered = {key.lower(): value for key, value in options.items()}
    metadata = lowered.get("metadata")
    if not metadata:
        raise PoraOptionError(
            'the Pora data source needs option("metadata", URL): the metadata store of '
            "the cluster (sqlite:///path or zk://host:port/prefix)"
        )
    name = stream or lowered.get("stream") or lowered.get("path")
    if not name:
        raise PoraOptionError(
            'name the stream: .load("name") / .save("name") / .start("name") or '
            'option("stream", "name")'
        )
    values: dict[str, object] = {}
    for spelled, value in options.items():
        key = spelled.lower()
        if key in _INT_OPTIONS:
            field = _INT_OPTIONS[key]
            values[field] = _int(spelled, value, _INT_BOUNDS[field])
        elif key in _BOOL_OPTIONS:
            values[_BOOL_OPTIONS[key]] = _bool(spelled, value)
        elif key in _STRING_OPTIONS:
            values[_STRING_OPTIONS[key]] = value
        elif key not in _SPARK_OPTIONS:
            known = sorted([*_INT_OPTIONS, *_BOOL_OPTIONS, *_STRING_OPTIONS, *_SPARK_OPTIONS])
            raise PoraOptionError(f"unknown option {key!r} of the Pora data source; known: {known}")
    parsed = PoraOptions(metadata=metadata, stream=name, **values)  # type: ignore[arg-type]
    if parsed.starting_position not in ("earliest", "latest"):
        raise PoraOptionError(
            f"option starting_position={parsed.starting_position!r}: use earliest or latest"
        )
    return parsed


def _int(key: str, value: str, bounds: tuple[int, int]) -> int:
    low, high = bounds
    wanted = f"at least {low}" if high >= 2**31 - 1 else f"from {low} to {high}"
    try:
        number = int(value)
    except ValueError:
        raise PoraOptionError(f"option {key}={value!r} must be an integer, {wanted}") from None
    if not low <= number <= high:
        raise PoraOptionError(f"option {key}={value!r} must be {wanted}")
    return number


def _bool(key: str, value: str) -> bool:
    lowered = str(value).lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise PoraOptionError(f"option {key}={value!r} must be true or false")
