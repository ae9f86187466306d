"""What a simulated run did, as its clients saw it: each writer's acknowledgements
(ledger, entry id, payload) and fence, each recovery's and close's result, each
reader's bytes; every event checked against the invariants as it is recorded."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from simulation import invariants


@dataclass
class History:
    seed: int
    #: (ledger, entry) -> the payload acknowledged
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    #: (ledger, entry) -> the bytes first seen there, and by whom
    seen: dict[tuple[int, int], tuple[bytes, str]] = field(default_factory=dict)
    #: writer -> (its LAC when it first saw LedgerFenced, the step of that)
    fenced_at: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: ledger -> (last entry id, length) it closed at
    closed: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: (ledger, entry) -> addresses that took a recovery add of it
    recovery_adds: dict[tuple[int, int], set[str]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    #: writer -> (the last entry id it had issued when the delete of its ledger
    #: returned, the step of that)
    deleted_at: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: ledgers deleted, and the nodes (address, instance id) that deleted them
    deleted_ledgers: set[int] = field(default_factory=set)
    deleted_on: set[tuple[str, str]] = field(default_factory=set)
    #: the step a delete started at (None: none did)
    delete_started_at: int | None = None
    #: the step of the writer's first failed append, and its error's type name
    writer_first_failure: tuple[int, str] | None = None
    log: list[str] = field(default_factory=list)
    step: int = 0
    #: the store's URL (a temporary folder's): left out of the log, so that a seed's
    #: replay in another folder logs the same text
    store_url: str = ""

    def note(self, text: str) -> int:
        self.step += 1
        self.log.append(f"{self.step:5d} t={trio.current_time():9.4f} {text}")
        return self.step

    def acknowledged(
        self, writer: str, ledger_id: int, entry_id: int, payload: bytes, started: int
    ) -> None:
        self.note(f"{writer} ack {ledger_id}/{entry_id}")
        invariants.check_ack(self, writer, ledger_id, entry_id, payload, started)
        self.acked[(ledger_id, entry_id)] = payload

    def fenced(self, writer: str, lac: int) -> None:
        self.note(f"{writer} fenced at LAC {lac}")
        if writer not in self.fenced_at:
            self.fenced_at[writer] = (lac, self.step)
        invariants.check_fence(self, writer, lac)

    def delete_started(self) -> None:
        self.delete_started_at = self.note("deleter starts")

    def deleted(self, writer: str, ledger_id: int, issued: int, gone: set[tuple[str, str]]) -> None:
        """The delete of `writer`'s ledger returned, the writer having issued entries
        up to `issued`."""
        step = self.note(f"deleter deleted {ledger_id}; {writer} issued up to {issued}")
        self.deleted_at.setdefault(writer, (issued, step))
        self.deleted_ledgers.add(ledger_id)
        self.deleted_on |= gone

    def writer_failed(self, error: BaseException) -> None:
        step = self.note(f"writer append failed: {type(error).__name__}")
        if self.writer_first_failure is None:
            self.writer_first_failure = (step, type(error).__name__)
        invariants.check_deleted_writer(self, error)

    def failed(self, who: str, error: BaseException) -> None:
        name = type(error).__name__
        self.failures[name] = self.failures.get(name, 0) + 1
        text = str(error).replace(self.store_url, "<store>") if self.store_url else str(error)
        self.note(f"{who} failed: {name}: {text[:120]}")

    def read(self, reader: str, ledger_id: int, entry_id: int, data: bytes) -> None:
        self.note(f"{reader} read {ledger_id}/{entry_id}")
        invariants.check_bytes(self, reader, ledger_id, entry_id, data)
        payload = self.acked.get((ledger_id, entry_id))
        if payload is not None and payload != data:
            invariants.fail(
                self, f"{reader} read other bytes than acknowledged at {ledger_id}/{entry_id}"
            )

    def closed_at(self, who: str, ledger_id: int, last_entry_id: int, length: int) -> None:
        self.note(f"{who} sees {ledger_id} closed at {last_entry_id} ({length} bytes)")
        invariants.check_close(self, who, ledger_id, last_entry_id, length)
        self.closed[ledger_id] = (last_entry_id, length)

    def recovery_added(self, address: str, ledger_id: int, entry_ids: list[int]) -> None:
        for entry_id in entry_ids:
            self.recovery_adds.setdefault((ledger_id, entry_id), set()).add(address)
