"""The replicated entry: what the replicating client stores on the nodes as an entry's
payload (docs/replication.md, "Entries on the wire").

    replicated-entry := format u8 = 1
                        length_after u64   payload bytes of this entry and every one before
                        crc u32            CRC-32C of (ledger_id i64, entry_id i64,
                                           length_after u64, payload)
                        payload

The crc covers the ledger and entry ids although they are not stored in the entry, so
bytes a node returns under the wrong id fail the check like damaged bytes do.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c

from pora.client.replication.errors import EntryDamaged

ENTRY_FORMAT: Final = 1
HEADER: Final = struct.Struct(">BQI")
HEADER_BYTES: Final = HEADER.size  # 13
_CRC_PREFIX: Final = struct.Struct(">qqQ")
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


def _crc(ledger_id: int, entry_id: int, length_after: int, payload: bytes | memoryview) -> int:
    prefix = _CRC_PREFIX.pack(ledger_id, entry_id, length_after)
    return int(crc32c.crc32c(payload, crc32c.crc32c(prefix)))


def encode_entry(
    ledger_id: int,
    entry_id: int,
    length_after: int,
    payload: bytes,
    payload_limit: int | None = None,
) -> bytes:
    """The bytes stored for one entry. `length_after` counts `payload` and every earlier
    entry's payload, so it is at least `len(payload)`."""
    if ledger_id < 0 or entry_id < 0:
        raise ValueError(f"ledger {ledger_id}, entry {entry_id}: ids are never negative")
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
    return encode_checked_entry(ledger_id, entry_id, length_after, payload)


def encode_checked_entry(ledger_id: int, entry_id: int, length_after: int, payload: bytes) -> bytes:
    """`encode_entry` for a caller that keeps the arguments valid itself (the writer:
    its ids count up from 0 and its lengths add payloads up): once per append, so
    without the checks."""
    crc = _crc32c(payload, _crc32c(_CRC_PREFIX_PACK(ledger_id, entry_id, length_after)))
    return _HEADER_PACK(ENTRY_FORMAT, length_after, crc) + payload


def decode_entry(ledger_id: int, entry_id: int, data: bytes | memoryview) -> ReplicatedEntry:
    """The entry stored under (ledger_id, entry_id); EntryDamaged names what does not
    match when the bytes are not that entry."""
    if len(data) < HEADER_BYTES:
        raise EntryDamaged(
            ledger_id, entry_id, f"{len(data)} bytes, shorter than the {HEADER_BYTES}-byte header"
        )
    entry_format, length_after, stored_crc = HEADER.unpack_from(data)
    if entry_format != ENTRY_FORMAT:
        raise EntryDamaged(ledger_id, entry_id, f"format {entry_format}, expected {ENTRY_FORMAT}")
    payload = bytes(memoryview(data)[HEADER_BYTES:])
    if length_after < len(payload):
        raise EntryDamaged(
            ledger_id,
            entry_id,
            f"length_after {length_after} is less than its own {len(payload)}-byte payload",
        )
    computed = _crc(ledger_id, entry_id, length_after, payload)
    if computed != stored_crc:
        raise EntryDamaged(
            ledger_id,
            entry_id,
            f"crc {computed:#010x} computed, {stored_crc:#010x} stored (bytes damaged, or "
            "another ledger's or entry's)",
        )
    return ReplicatedEntry(ledger_id, entry_id, length_after, payload)
