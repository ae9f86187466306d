"""Named documents in the metadata store: the rules every backend checks before it
touches anything (spaces, names, sizes, pages) and how a name becomes a ZooKeeper
znode name. No I/O here; pora/meta/sqlite_documents.py and pora/meta/zk_store.py do
the storing (docs/metadata.md, "Documents")."""

from __future__ import annotations

from pora.meta.errors import InvalidMetadata, MetadataRecordTooLarge

#: a space or a name holds at most this many bytes once encoded as UTF-8
DOCUMENT_KEY_BYTES_MAX = 200
#: the space of the nodes' draining marks: one document named after each draining
#: node's address (docs/rereplication.md, A14); `list_nodes` reads it
NODE_DRAINING_SPACE = "node-draining"
#: the characters a znode name keeps as they are; every other byte is percent-encoded
_ZNODE_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def document_key(space: str, name: str) -> str:
    """How errors name a document."""
    return f"document {name!r} in space {space!r}"


def _utf8(what: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise InvalidMetadata(f"a document's {what} must be a str, not {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidMetadata(
            f"a document's {what} {value!r} is not valid Unicode ({error.reason} at "
            f"position {error.start}): use text that encodes as UTF-8"
        ) from None


def _check_key(what: str, value: object) -> bytes:
    encoded = _utf8(what, value)
    if not encoded:
        raise InvalidMetadata(f"a document's {what} must not be empty")
    if len(encoded) > DOCUMENT_KEY_BYTES_MAX:
        raise InvalidMetadata(
            f"a document's {what} {value!r} is {len(encoded)} bytes in UTF-8, over the "
            f"limit of {DOCUMENT_KEY_BYTES_MAX}: use a shorter one"
        )
    if b"\x00" in encoded:
        raise InvalidMetadata(f"a document's {what} {value!r} holds a NUL character")
    return encoded


def _check_space(space: object) -> None:
    if b"/" in _check_key("space", space):
        raise InvalidMetadata(f"a document's space {space!r} holds a '/': spaces are one level")


def check_document_key(space: str, name: str) -> None:
    """InvalidMetadata, saying what is wrong, unless `space` and `name` are non-empty
    str of at most DOCUMENT_KEY_BYTES_MAX UTF-8 bytes without NUL, and `space` has no
    '/' (it names a folder in ZooKeeper; a name may hold anything else)."""
    _check_space(space)
    _check_key("name", name)


def check_document_data(space: str, name: str, data: object, limit: int) -> bytes:
    """The document's data as bytes; InvalidMetadata if it is not bytes-like,
    MetadataRecordTooLarge if it is over `limit` bytes."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidMetadata(
            f"{document_key(space, name)}: data must be bytes, not {type(data).__name__}"
        )
    data = bytes(data)
    if len(data) > limit:
        raise MetadataRecordTooLarge(document_key(space, name), len(data), limit)
    return data


def check_version(space: str, name: str, expected_version: object) -> int:
    if not isinstance(expected_version, int) or isinstance(expected_version, bool):
        raise InvalidMetadata(
            f"{document_key(space, name)}: expected_version must be an int, not "
            f"{type(expected_version).__name__}"
        )
    if expected_version < 0:
        raise InvalidMetadata(
            f"{document_key(space, name)}: expected_version {expected_version} is negative"
        )
    return expected_version


def check_page(space: str, after: object, limit: object) -> bytes:
    """Check a listing's arguments; returns `after` in UTF-8 (names compare bytewise)."""
    _check_space(space)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidMetadata(f"a listing's limit must be a positive int, not {limit!r}")
    return _utf8("listing's after", after)


def page_of(names: list[str], after: str, limit: int) -> list[str]:
    """The names above `after`, sorted bytewise on UTF-8, at most `limit` of them.
    (UTF-8 keeps code point order, so str order is byte order.)"""
    return sorted(name for name in names if name > after)[:limit]


def znode_name(key: str) -> str:
    """`key` as a znode name: every byte of its UTF-8 outside [A-Za-z0-9._-] as %XX,
    and the dots of '.' and '..' too (ZooKeeper refuses those as path segments)."""
    encoded = key.encode("utf-8")
    if key in (".", ".."):
        return "%2E" * len(key)
    return "".join(chr(b) if b in _ZNODE_SAFE else f"%{b:02X}" for b in encoded)


def key_of_znode(znode: str) -> str:
    """The inverse of `znode_name`. InvalidMetadata for a znode it did not make."""
    out = bytearray()
    i = 0
    while i < len(znode):
        if znode[i] == "%":
            digits = znode[i + 1 : i + 3]
            if len(digits) != 2 or not all(c in "0123456789ABCDEFabcdef" for c in digits):
                raise _not_escaped(znode)
            out.append(int(digits, 16))
            i += 3
        elif ord(znode[i]) in _ZNODE_SAFE:
            out.append(ord(znode[i]))
            i += 1
        else:
            raise _not_escaped(znode)
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_escaped(znode) from None


def _not_escaped(znode: str) -> InvalidMetadata:
    return InvalidMetadata(
        f"znode {znode!r} is not a document name escaped by Pora: something else wrote "
        "under the documents znode; remove it"
    )


__all__ = [
    "DOCUMENT_KEY_BYTES_MAX",
    "NODE_DRAINING_SPACE",
    "check_document_data",
    "check_document_key",
    "check_page",
    "check_version",
    "document_key",
    "key_of_znode",
    "page_of",
    "znode_name",
]
