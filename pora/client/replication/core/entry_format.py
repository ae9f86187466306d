"""The replicated entry: what the replicating client stores on the nodes as an entry's
payload (docs/replication.md, "Entries on the wire").

    replicated-entry := format u8 = 2 | 1
                        length_after u64   payload bytes of this entry and every one before
                        crc u32            format 2: CRC-32C of (ledger_id i64, entry_id i64,
                                           token u64, length_after u64, payload);
                                           format 1: the same without the token
                        payload

The crc covers the ledger and entry ids although they are not stored in the entry, so
bytes a node returns under the wrong id fail the check like damaged bytes do; and
(format 2) the ledger record's incarnation token, so an entry of an earlier ledger
with the same id (a metadata store lost, ids handed out again) fails it too. A ledger
whose record has a token (every one `create_ledger` makes) takes format 2 only; a
record without one (token 0, written before tokens) takes format 1 only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c

from pora.client.replication.errors import EntryDamaged

#: the format of a ledger with an incarnation token, and of one without (token 0)
ENTRY_FORMAT: Final = 2
ENTRY_FORMAT_UNTOKENED: Final = 1
HEADER: Final = struct.Struct(">BQI")
HEADER_BYTES: Final = HEADER.size  # 13
_CRC_PREFIX: Final = struct.Struct(">qqQ")
_CRC_PREFIX_TOKENED: Final = struct.Struct(">qqQQ")
_CRC_PREFIX_TOKENED_PACK: Final = _CRC_PREFIX_TOKENED.pack
LENGTH_MAX: Final = (1 << 64) - 1
_CRC_PREFIX_PACK: Final = _CRC_PREFIX.pack
_HEADER_PACK: Final = HEADER.pack
_crc32c: Final = crc32c.crc32c


@dataclass(frozen=True)
class ReplicatedEntry:
    ledger_id: int
    entry_id: int
    length_after: int
    payload: bytes


def payload_bytes_max(node_entry_bytes_max: int) -> int:
    """The largest application payload a node with this entry limit can hold."""
    return max(0, node_entry_bytes_max - HEADER_BYTES)


def _crc(
    ledger_id: int, entry_id: int, token: int, length_after: int, payload: bytes | memoryview
) -> int:
    if token:
        prefix = _CRC_PREFIX_TOKENED_PACK(ledger_id, entry_id, token, length_after)
    else:
        prefix = _CRC_PREFIX_PACK(ledger_id, entry_id, length_after)
    return int(crc32c.crc32c(payload, crc32c.crc32c(prefix)))


def encode_entry(
    ledger_id: int,
    entry_id: int,
    length_after: int,
    payload: bytes,
    payload_limit: int | None = None,
    *,
    token: int = 0,
) -> bytes:
    """The bytes stored for one entry of the ledger whose record holds `token` (0: a
    record without one). `length_after` counts `payload` and every earlier entry's
    payload, so it is at least `len(payload)`."""
    if ledger_id < 0 or entry_id < 0:
        raise ValueError(f"ledger {ledger_id}, entry {entry_id}: ids are never negative")
    if not 0 <= token < 1 << 64:
        raise ValueError(f"ledger {ledger_id}: token {token} is not a u64")
    if not len(payload) <= length_after <= LENGTH_MAX:
        raise ValueError(
            f"ledger {ledger_id}, entry {entry_id}: length_after {length_after} must be at "
            f"least the payload's {len(payload)} bytes and fit in 64 bits"
        )
    if payload_limit is not None and len(payload) > payload_limit:
        raise ValueError(
            f"ledger {ledger_id}, entry {entry_id}: a payload of {len(payload)} bytes exceeds "
            f"the {payload_limit} bytes the nodes take (entry_bytes_max - {HEADER_BYTES})"
        )
    return encode_checked_entry(ledger_id, entry_id, length_after, payload, token)


def encode_checked_entry(
    ledger_id: int, entry_id: int, length_after: int, payload: bytes, token: int
) -> bytes:
    """`encode_entry` for a caller that keeps the arguments valid itself (the writer:
    its ids count up from 0 and its lengths add payloads up, its token is the
    record's): once per append, so without the checks."""
    if token:
        prefix = _CRC_PREFIX_TOKENED_PACK(ledger_id, entry_id, token, length_after)
        return _HEADER_PACK(ENTRY_FORMAT, length_after, _crc32c(payload, _crc32c(prefix))) + payload
    crc = _crc32c(payload, _crc32c(_CRC_PREFIX_PACK(ledger_id, entry_id, length_after)))
    return _HEADER_PACK(ENTRY_FORMAT_UNTOKENED, length_after, crc) + payload


def decode_entry(
    ledger_id: int, entry_id: int, data: bytes | memoryview, *, token: int = 0
) -> ReplicatedEntry:
    """The entry stored under (ledger_id, entry_id) of the ledger whose record holds
    `token`; EntryDamaged names what does not match when the bytes are not that entry
    (damaged, another entry's, or an earlier ledger's of the same id)."""
    if len(data) < HEADER_BYTES:
        raise EntryDamaged(
            ledger_id, entry_id, f"{len(data)} bytes, shorter than the {HEADER_BYTES}-byte header"
        )
    entry_format, length_after, stored_crc = HEADER.unpack_from(data)
    expected = ENTRY_FORMAT if token else ENTRY_FORMAT_UNTOKENED
    if entry_format != expected:
        raise EntryDamaged(
            ledger_id,
            entry_id,
            f"format {entry_format}, expected {expected} (a record "
            f"{'with' if token else 'without'} an incarnation token; an entry of another "
            "incarnation of this ledger id?)",
        )
    payload = bytes(memoryview(data)[HEADER_BYTES:])
    if length_after < len(payload):
        raise EntryDamaged(
            ledger_id,
            entry_id,
            f"length_after {length_after} is less than its own {len(payload)}-byte payload",
        )
    computed = _crc(ledger_id, entry_id, token, length_after, payload)
    if computed != stored_crc:
        raise EntryDamaged(
            ledger_id,
            entry_id,
            f"crc {computed:#010x} computed, {stored_crc:#010x} stored (bytes damaged, or "
            "another ledger's or entry's, or an earlier ledger's of the same id)",
        )
    return ReplicatedEntry(ledger_id, entry_id, length_after, payload)
