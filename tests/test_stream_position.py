"""pora.Position: ordered like the stream, hashable, and both textual forms round-trip;
bad input gets a typed error saying what is wrong."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pora import InvalidArgument, InvalidArgumentType, Position

numbers = st.integers(min_value=0, max_value=2**63 - 1)
positions = st.builds(Position, numbers, numbers)


@given(positions)
def test_str_and_dict_round_trip(position: Position) -> None:
    assert Position.parse(str(position)) == position
    assert Position.from_dict(json.loads(json.dumps(position.to_dict()))) == position


@given(positions, positions)
def test_order_is_segment_then_entry(a: Position, b: Position) -> None:
    assert (a < b) == ((a.segment, a.entry) < (b.segment, b.entry))
    assert (a == b) == (hash(a) == hash(b) and str(a) == str(b))


def test_examples() -> None:
    assert str(Position(3, 17)) == "3:17"
    assert Position(0, 5) < Position(1, 0) < Position(1, 1)
    assert {Position(2, 2): "x"}[Position.parse("2:2")] == "x"
    assert Position(4, 9).to_dict() == {"segment": 4, "entry": 9}


def test_immutable() -> None:
    position = Position(1, 2)
    with pytest.raises(AttributeError):
        position.entry = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "3",
        "3:",
        ":4",
        "-1:2",
        "1:-2",
        "01:2",
        "1:02",
        " 1:2",
        "1:2 ",
        "1_0:2",
        "a:b",
        "1:2:3",
        "9223372036854775808:0",
    ],
)
def test_parse_refuses(text: str) -> None:
    with pytest.raises(InvalidArgument, match="position"):
        Position.parse(text)


@pytest.mark.parametrize(
    ("segment", "entry", "error"),
    [
        (-1, 0, InvalidArgument),
        (0, 2**63, InvalidArgument),
        (True, 0, InvalidArgumentType),
        (1.0, 0, InvalidArgumentType),
        ("1", 0, InvalidArgumentType),
    ],
)
def test_constructor_refuses(segment: object, entry: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="position's"):
        Position(segment, entry)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [{}, {"segment": 1}, {"segment": 1, "entry": 2, "x": 3}, {"segment": "1", "entry": 2}],
)
def test_from_dict_refuses(data: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        Position.from_dict(data)


def test_parse_refuses_non_str() -> None:
    with pytest.raises(InvalidArgumentType):
        Position.parse(12)  # type: ignore[arg-type]
