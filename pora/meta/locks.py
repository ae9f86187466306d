"""The rules every backend applies to a lock's arguments (docs/rereplication.md, A4):
a lock is named like a document, held by a named holder, for a positive lease."""

from __future__ import annotations

import math

from pora.meta.documents import check_document_key
from pora.meta.errors import InvalidMetadata

#: the document space whose rules a lock name follows (never stored there)
LOCK_SPACE = "locks"


def check_lock(name: str, holder: str, lease_s: float | None = None) -> None:
    """InvalidMetadata, saying what is wrong, unless `name` is a valid document name,
    `holder` a valid one too, and `lease_s` (when given) a finite number above 0."""
    check_document_key(LOCK_SPACE, name)
    if not isinstance(holder, str):
        raise InvalidMetadata(f"lock {name!r}: holder must be a str, not {type(holder).__name__}")
    check_document_key(LOCK_SPACE, holder)
    if lease_s is not None and (
        isinstance(lease_s, bool)
        or not isinstance(lease_s, int | float)
        or not math.isfinite(lease_s)
        or lease_s <= 0
    ):
        raise InvalidMetadata(f"lock {name!r}: lease_s must be a number above 0, not {lease_s!r}")
