"""Ledger states and the per-ledger metadata persisted in the index DB."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Final


class LedgerState(enum.IntEnum):
    """Lifecycle of a ledger on one node. Values are on disk: never reuse.

    Fencing is a separate flag, not a state: a fenced ledger is still Open (recovery
    adds may land) until recovery closes it.
    """

    OPEN = 1
    CLOSED = 2


NO_ENTRY: Final = -1  # last_entry_id / first_entry_id of a ledger with no entries

# Metadata encoding, version 2 (big-endian):
# version u8, state u8, fenced u8, reserved u8, last_entry_id i64, first_entry_id i64,
# sealed_last_entry_id i64, entry_count u64, payload_bytes u64, log_end u64,
# durable_seq i64, created_ms u64, last_add_confirmed i64, key_length u8
# (_NO_KEY: the ledger has no master key yet), then the master key.
_META_V2: Final = struct.Struct(">BBBBqqqQQQqQqB")
_META_VERSION: Final = 2
_NO_KEY: Final = 0xFF


@dataclass(slots=True)
class LedgerMeta:
    """What a node knows about one ledger. Owned by that ledger's worker.

    `durable_seq`: every journal record of this ledger with seq <= durable_seq is
    reflected in the entry log and the index; replay starts after it.
    `log_end`: where the next entry-log record is written (positioned writes make
    replay idempotent: a record rewritten at the same place gives the same bytes).
    `sealed_last_entry_id`: for a closed ledger, the last entry it keeps; reads above
    it fail. NO_ENTRY for an open ledger (no seal yet) or one sealed empty.
    """

    ledger_id: int
    state: LedgerState = LedgerState.OPEN
    fenced: bool = False
    last_entry_id: int = NO_ENTRY
    first_entry_id: int = NO_ENTRY
    sealed_last_entry_id: int = NO_ENTRY
    entry_count: int = 0
    payload_bytes: int = 0
    log_end: int = 0
    durable_seq: int = -1
    created_ms: int = 0
    #: the highest last-add-confirmed writers piggybacked on this ledger's adds
    lac: int = -1
    #: fixed by the first add, fence or close (None until then)
    master_key: bytes | None = None
    #: the journal seq of the record that fenced the ledger (-1: fenced by the state
    #: the node started from); in memory only: a node in a cluster answers a fence
    #: once its instance's mark is past this record (R27)
    fence_seq: int = field(default=-1, compare=False)

    def encode(self) -> bytes:
        key = self.master_key
        return _META_V2.pack(
            _META_VERSION,
            int(self.state),
            1 if self.fenced else 0,
            0,
            self.last_entry_id,
            self.first_entry_id,
            self.sealed_last_entry_id,
            self.entry_count,
            self.payload_bytes,
            self.log_end,
            self.durable_seq,
            self.created_ms,
            self.lac,
            _NO_KEY if key is None else len(key),
        ) + (key or b"")

    @classmethod
    def decode(cls, ledger_id: int, data: bytes) -> LedgerMeta:
        if len(data) < _META_V2.size or data[0] != _META_VERSION:
            raise ValueError(
                f"ledger {ledger_id}: metadata of {len(data)} bytes, version "
                f"{data[0] if data else None}; this build reads version {_META_VERSION}"
            )
        (
            _version,
            state,
            fenced,
            _reserved,
            last_entry_id,
            first_entry_id,
            sealed_last_entry_id,
            entry_count,
            payload_bytes,
            log_end,
            durable_seq,
            created_ms,
            lac,
            key_length,
        ) = _META_V2.unpack_from(data)
        key = None if key_length == _NO_KEY else bytes(data[_META_V2.size :])
        if len(data) != _META_V2.size + (0 if key is None else key_length):
            raise ValueError(f"ledger {ledger_id}: metadata of {len(data)} bytes is damaged")
        return cls(
            ledger_id=ledger_id,
            state=LedgerState(state),
            fenced=bool(fenced),
            last_entry_id=last_entry_id,
            first_entry_id=first_entry_id,
            sealed_last_entry_id=sealed_last_entry_id,
            entry_count=entry_count,
            payload_bytes=payload_bytes,
            log_end=log_end,
            durable_seq=durable_seq,
            created_ms=created_ms,
            lac=lac,
            master_key=key,
        )

    def info(self) -> LedgerInfo:
        last = self.sealed_last_entry_id if self.state is LedgerState.CLOSED else self.last_entry_id
        return LedgerInfo(
            ledger_id=self.ledger_id,
            state=self.state_name(),
            first_entry_id=self.first_entry_id,
            last_entry_id=last,
            entry_count=self.entry_count,
            payload_bytes=self.payload_bytes,
            created_ms=self.created_ms,
        )

    def state_name(self) -> str:
        """open / closed / fenced, as operators see it."""
        if self.state is LedgerState.CLOSED:
            return "closed"
        return "fenced" if self.fenced else "open"


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """A read-only view of one ledger, for callers outside its worker."""

    ledger_id: int
    state: str  # "open", "closed" or "fenced"
    first_entry_id: int
    last_entry_id: int  # for a closed ledger: the sealed last entry
    entry_count: int
    payload_bytes: int
    created_ms: int
