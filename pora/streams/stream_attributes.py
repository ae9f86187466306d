"""A stream's attributes (docs/streams.md, "Attributes"): the application's own
(key, value) strings kept in the stream document, changed by compare-and-set with the
values the caller expects, so that two writers agreeing on, say, a table schema
cannot both win. No I/O: `Stream.attributes` and `Stream.set_attributes` do the
reading and writing around these.

Bounded so that the document stays far below what a metadata record holds: at most
ATTRIBUTES_MAX keys of 1..ATTRIBUTE_KEY_CHARS_MAX characters, and
ATTRIBUTES_BYTES_MAX bytes of them all as the document's JSON holds them (escapes
included), so that with every other field at its bound the document stays under
1 MiB (tests/test_stream_transactions_model.py measures it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ledger.errors import InvalidArgument, InvalidArgumentType
from pora.meta.errors import InvalidMetadata

if TYPE_CHECKING:
    pass

ATTRIBUTES_MAX = 64
ATTRIBUTE_KEY_CHARS_MAX = 128
#: the attributes' JSON (an Arrow schema of some 1,000 columns fits)
ATTRIBUTES_BYTES_MAX = 96 * 1024


def attributes_bytes(attributes: tuple[tuple[str, str], ...]) -> int:
    """What the attributes take in the document's JSON."""
    return len(json.dumps(dict(attributes), separators=(",", ":")).encode())


def check_attributes(attributes: tuple[tuple[str, str], ...], where: str) -> None:
    """Sorted by key, each key once, within the bounds; InvalidMetadata otherwise."""
    keys = [key for key, _ in attributes]
    if keys != sorted(set(keys)) or len(keys) > ATTRIBUTES_MAX:
        raise InvalidMetadata(f"{where}: attributes not by key, repeated or too many")
    if any(not isinstance(k, str) or not isinstance(v, str) for k, v in attributes):
        raise InvalidMetadata(f"{where}: an attribute key or value is not a string")
    if attributes_bytes(attributes) > ATTRIBUTES_BYTES_MAX:
        raise InvalidMetadata(f"{where}: attributes over {ATTRIBUTES_BYTES_MAX} bytes")


def decode_attributes(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise TypeError(f"attributes {raw!r} are not an object")
    return tuple(sorted(raw.items()))


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidArgumentType(f"an attribute key must be a str, not {type(key).__name__}")
    if not 0 < len(key) <= ATTRIBUTE_KEY_CHARS_MAX:
        raise InvalidArgument(
            f"an attribute key has 1 to {ATTRIBUTE_KEY_CHARS_MAX} characters, not {len(key)}"
        )
    return key


def check_changes(changes: object, what: str) -> dict[str, str | None]:
    """`changes` (or `expected`) as a dict of key to str or None; InvalidArgument."""
    if not isinstance(changes, Mapping):
        raise InvalidArgumentType(
            f"{what} must be a mapping of str to str or None, not {type(changes).__name__}"
        )
    checked: dict[str, str | None] = {}
    for key, value in changes.items():
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentType(
                f"{what}[{key!r}] must be a str or None, not {type(value).__name__}"
            )
        checked[_check_key(key)] = value
    return checked
