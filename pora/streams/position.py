"""`Position`: where an entry sits in a stream, (segment sequence number, entry id in
that segment's ledger). Segments are numbered when they become visible in the
stream, so position order is stream order.

Two textual forms round-trip: `str(position)` ("SEGMENT:ENTRY", e.g. "12:3071")
with `Position.parse`, and a JSON-ready dict (`to_dict` / `from_dict`), the form
Spark keeps its offsets in."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ledger.errors import InvalidArgument, InvalidArgumentType

#: both numbers fit a signed 64-bit integer (ledger entry ids do, JSON readers cope)
_NUMBER_MAX = (1 << 63) - 1
#: decimal digits only: no sign, no spaces, no underscores (int() would take those)
_TEXT = re.compile(r"(0|[1-9][0-9]{0,18}):(0|[1-9][0-9]{0,18})")


def _check_number(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentType(
            f"a position's {what} must be an int, not {type(value).__name__} ({value!r})"
        )
    if not 0 <= value <= _NUMBER_MAX:
        raise InvalidArgument(f"a position's {what} must be in [0, 2**63), not {value}")
    return value


@dataclass(frozen=True, order=True, slots=True)
class Position:
    """An entry's place in a stream: ordered (by segment, then entry), hashable and
    immutable."""

    segment: int
    entry: int

    def __post_init__(self) -> None:
        _check_number("segment", self.segment)
        _check_number("entry", self.entry)

    def __str__(self) -> str:
        return f"{self.segment}:{self.entry}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """The position `str()` wrote ("SEGMENT:ENTRY", decimal, no leading zeros)."""
        if not isinstance(text, str):
            raise InvalidArgumentType(f"a position's text must be a str, not {type(text).__name__}")
        match = _TEXT.fullmatch(text)
        if match is None:
            raise InvalidArgument(
                f"{text!r} is not a position: write it as SEGMENT:ENTRY in decimal, e.g. '3:17'"
            )
        return cls(int(match[1]), int(match[2]))

    def to_dict(self) -> dict[str, int]:
        return {"segment": self.segment, "entry": self.entry}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Position:
        """The position `to_dict()` wrote (exactly the keys "segment" and "entry")."""
        if not isinstance(data, Mapping):
            raise InvalidArgumentType(
                f"a position's dict must be a mapping, not {type(data).__name__}"
            )
        if set(data) != {"segment", "entry"}:
            raise InvalidArgument(
                f"a position's dict holds exactly 'segment' and 'entry', not {sorted(data)!r}"
            )
        return cls(data["segment"], data["entry"])
