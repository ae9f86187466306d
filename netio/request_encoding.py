"""Requests from messages to frames: the client's side of every request, in each
protocol version a node serves (`encode_request`), and the adds' own encoders,
which skip the message objects (the hot path of every add).

The server's side, the bounded `RequestDecoder`, is request_codec.py.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from netio import frames
from netio.framing import (
    _ADD_LENGTH_BASE,
    _ADD_PACK,
    _FLAG_RECOVERY,
    _OP_ADD,
    _OP_RUN,
    _RUN_LENGTH_BASE,
    _RUN_MAX,
    _RUN_PACK,
    _V4,
    _VERSION_NEWEST,
    _check_key,
    _header,
    _sizes_struct,
)
from netio.messages import (
    AddBatch,
    AddEntry,
    AddRun,
    Close,
    Delete,
    Fence,
    ListLedgers,
    ReadEntry,
    ReadLac,
    ReadRange,
    RequestMessage,
    WriteLac,
)
from netio.security import MASTER_KEY_BYTES_MAX


def encode_add_entry(
    request_id: int,
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    *,
    master_key: bytes = b"",
    last_add_confirmed: int = -1,
    recovery: bool = False,
) -> bytes:
    """One ADD_ENTRY frame."""
    key_bytes = len(master_key)
    if key_bytes > MASTER_KEY_BYTES_MAX:
        _check_key(master_key)
    head = _ADD_PACK(
        _ADD_LENGTH_BASE + key_bytes + len(payload),
        _VERSION_NEWEST,
        _OP_ADD,
        _FLAG_RECOVERY if recovery else 0,
        0,
        request_id,
        ledger_id,
        entry_id,
        last_add_confirmed,
        key_bytes,
    )
    if key_bytes:
        return b"".join((head, master_key, payload))
    return head + payload


def encode_add_run(
    request_id: int,
    ledger_id: int,
    first_entry_id: int,
    payloads: Sequence[bytes],
    *,
    master_key: bytes = b"",
    last_add_confirmed: int = -1,
    recovery: bool = False,
    sizes: Sequence[int] | None = None,
) -> bytes:
    """One ADD_RUN frame: entries first_entry_id, first_entry_id + 1, ... of one ledger
    with these payloads (1 to RUN_ENTRIES_MAX of them), answered by one response.
    `sizes`: the payloads' lengths, when the caller has them (it cut its frames by
    them); taken as they are, not measured again."""
    count = len(payloads)
    if not 1 <= count <= _RUN_MAX:
        raise ValueError(f"an ADD_RUN carries 1 to {_RUN_MAX} entries, got {count}")
    _check_key(master_key)
    sizes = _payload_sizes(payloads, sizes)
    key_bytes = len(master_key)
    head = _RUN_PACK(
        _RUN_LENGTH_BASE + key_bytes + 4 * count + sum(sizes),
        _VERSION_NEWEST,
        _OP_RUN,
        _FLAG_RECOVERY if recovery else 0,
        0,
        request_id,
        ledger_id,
        first_entry_id,
        last_add_confirmed,
        count,
        key_bytes,
    )
    return b"".join((head, master_key, _sizes_struct(count).pack(*sizes), *payloads))


def encode_add_batch(
    request_id: int,
    ledger_id: int,
    entry_ids: Sequence[int],
    payloads: Sequence[bytes],
    *,
    master_key: bytes = b"",
    last_add_confirmed: int = -1,
    recovery: bool = False,
    sizes: Sequence[int] | None = None,
) -> bytes:
    """One ADD_BATCH frame (version 4): entries of one ledger with these strictly
    increasing ids and payloads (1 to RUN_ENTRIES_MAX of them). `sizes` as for
    `encode_add_run`."""
    count = len(payloads)
    if not 1 <= count <= _RUN_MAX or len(entry_ids) != count:
        raise ValueError(
            f"an ADD_BATCH carries 1 to {_RUN_MAX} entries, one id each; got "
            f"{len(entry_ids)} ids and {count} payloads"
        )
    _check_key(master_key)
    sizes = _payload_sizes(payloads, sizes)
    items = struct.Struct(">" + "qI" * count).pack(
        *[value for pair in zip(entry_ids, sizes, strict=True) for value in pair]
    )
    body = (
        frames.ADD_BATCH_REQUEST_FIXED.pack(ledger_id, last_add_confirmed, count, len(master_key))
        + master_key
        + items
    )
    size = len(body) + sum(sizes)
    flags = _FLAG_RECOVERY if recovery else 0
    head = _header(frames.Opcode.ADD_BATCH, flags, 0, request_id, size, _V4)
    return b"".join((head, body, *payloads))


def _payload_sizes(payloads: Sequence[bytes], sizes: Sequence[int] | None) -> Sequence[int]:
    if sizes is None:
        return list(map(len, payloads))
    if len(sizes) != len(payloads):
        raise ValueError(f"{len(sizes)} sizes given for {len(payloads)} payloads")
    return sizes


def encode_request(message: RequestMessage, version: int = _VERSION_NEWEST) -> bytes:
    """The frame of any request message, in protocol `version` (READ_LAC and
    READ_RANGE bodies depend on it; ADD_BATCH and WRITE_LAC exist from 4 on)."""
    m = message
    if version < _V4:
        return _with_version(_encode_request_v3(m), version)
    if isinstance(m, AddBatch):
        return encode_add_batch(
            m.request_id,
            m.ledger_id,
            m.entry_ids,
            m.payloads,
            master_key=m.master_key,
            last_add_confirmed=m.last_add_confirmed,
            recovery=m.recovery,
        )
    if isinstance(m, WriteLac):
        _check_key(m.master_key)
        body = (
            frames.WRITE_LAC_REQUEST.pack(m.ledger_id, m.last_add_confirmed, len(m.master_key))
            + m.master_key
        )
        return _header(frames.Opcode.WRITE_LAC, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, ReadLac):
        _check_key(m.master_key)
        body = (
            frames.READ_LAC_REQUEST_V4.pack(m.ledger_id, m.known_lac, m.wait_ms, len(m.master_key))
            + m.master_key
        )
        flags = (frames.Flag.FENCE if m.fence else 0) | (frames.Flag.ENTRY if m.with_entry else 0)
        return _header(frames.Opcode.READ_LAC, flags, 0, m.request_id, len(body)) + body
    if isinstance(m, ReadRange):
        _check_key(m.master_key)
        body = (
            frames.READ_RANGE_REQUEST_V4.pack(
                m.ledger_id,
                m.first_entry_id,
                m.last_entry_id,
                m.max_entries,
                m.max_bytes,
                len(m.master_key),
            )
            + m.master_key
        )
        flags = frames.Flag.FENCE if m.fence else 0
        return _header(frames.Opcode.READ_RANGE, flags, 0, m.request_id, len(body)) + body
    return _encode_request_v3(m)


def _with_version(frame: bytes, version: int) -> bytes:
    return frame[:4] + bytes([version]) + frame[5:]


def _encode_request_v3(message: RequestMessage) -> bytes:  # noqa: PLR0911 (one return per opcode)
    """The frame of a request whose body is the same in versions 2 to 4 (READ_LAC and
    READ_RANGE in their version-3 bodies), in the newest version's header."""
    m = message
    if isinstance(m, AddBatch | WriteLac):
        raise TypeError(f"{type(m).__name__} exists from protocol version {_V4} on")
    if isinstance(m, ReadLac | ReadRange) and (m.fence or m.master_key):
        raise ValueError(f"a fencing {type(m).__name__} exists from protocol version {_V4} on")
    if isinstance(m, ReadLac) and m.with_entry:
        raise ValueError(f"a ReadLac with its entry exists from protocol version {_V4} on")
    if isinstance(m, AddEntry):
        return encode_add_entry(
            m.request_id,
            m.ledger_id,
            m.entry_id,
            m.payload,
            master_key=m.master_key,
            last_add_confirmed=m.last_add_confirmed,
            recovery=m.recovery,
        )
    if isinstance(m, AddRun):
        return encode_add_run(
            m.request_id,
            m.ledger_id,
            m.first_entry_id,
            m.payloads,
            master_key=m.master_key,
            last_add_confirmed=m.last_add_confirmed,
            recovery=m.recovery,
        )
    if isinstance(m, ReadEntry):
        _check_key(m.master_key)
        body = (
            frames.READ_ENTRY_REQUEST.pack(m.ledger_id, m.entry_id, m.wait_ms, len(m.master_key))
            + m.master_key
        )
        flags = frames.Flag.FENCE if m.fence else 0
        return _header(frames.Opcode.READ_ENTRY, flags, 0, m.request_id, len(body)) + body
    if isinstance(m, ReadRange):
        body = frames.READ_RANGE_REQUEST.pack(
            m.ledger_id, m.first_entry_id, m.last_entry_id, m.max_entries, m.max_bytes
        )
        return _header(frames.Opcode.READ_RANGE, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, ReadLac):
        body = frames.LEDGER_ONLY.pack(m.ledger_id)
        return _header(frames.Opcode.READ_LAC, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, Fence):
        _check_key(m.master_key)
        body = frames.FENCE_REQUEST.pack(m.ledger_id, len(m.master_key)) + m.master_key
        return _header(frames.Opcode.FENCE, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, Close):
        _check_key(m.master_key)
        last = frames.CLOSE_AT_LAST_STORED if m.last_entry_id is None else m.last_entry_id
        body = frames.CLOSE_REQUEST.pack(m.ledger_id, last, len(m.master_key)) + m.master_key
        return _header(frames.Opcode.CLOSE, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, Delete):
        _check_key(m.master_key)
        body = frames.DELETE_REQUEST.pack(m.ledger_id, len(m.master_key)) + m.master_key
        return _header(frames.Opcode.DELETE, 0, 0, m.request_id, len(body)) + body
    if isinstance(m, ListLedgers):
        body = frames.LIST_REQUEST.pack(m.after_ledger_id, m.max_count)
        return _header(frames.Opcode.LIST_LEDGERS, 0, 0, m.request_id, len(body)) + body
    return _header(frames.Opcode.INFO, 0, 0, m.request_id, 0)
