"""What must hold in every simulated run of a stream (docs/streams.md), whatever the
faults. `StreamHistory` checks each event as it records it, so a violation stops the
run at the step that broke it; the end checks run once the network is healed.

- no acknowledged append is lost: each acknowledged position yields its payload in
  the final read;
- one position, one payload: for the writers' acknowledgements, the reader, the
  subscriber and the final read alike;
- the subscriber sees every acknowledged entry exactly once, in position order;
- a fenced writer is fenced: once a newer writer's takeover returned, no append the
  earlier writer starts is acknowledged, and none lands in the newer one's segments;
- nothing visible disappears: a segment once in the document stays there, on the
  same ledger and, once CLOSED, with the same last entry;
- no reader sees part of a commit: in every version of the document a transaction's
  segments are all visible, under one commit number shared with no other
  transaction's, or none is; and at the end every entry acknowledged in a segment of
  a transaction with any entry visible is in the final read;
- a commit with a key (or an app id and version) applies at most once: no reader
  ever gets entries of two attempts at one key;
- an aborted, skipped or collected transaction's entries are never visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from pora.streams.document import Segment, SegmentState
from pora.streams.position import Position
from simulation.invariants import InvariantViolation

#: a transaction's entries start with this, then "ATTEMPT|BATCH|..." (see txn_payload)
TXN_PREFIX = b"txn|"
#: what became of a transaction attempt: its outcome is one of these
ENDED_INVISIBLE = frozenset({"aborted", "skipped", "collected"})


def txn_payload(attempt: str, batch: str, segment: int, k: int, size: int) -> bytes:
    """A transaction's entry: names its attempt and its batch (the key or app version
    it commits with; "-" for none)."""
    head = TXN_PREFIX + f"{attempt}|{batch}|s{segment}k{k}|".encode()
    return (head * (size // len(head) + 1))[:size]


def txn_of(payload: bytes) -> tuple[str, str] | None:
    """(attempt, batch) of a transaction's entry, or None for a live writer's."""
    if not payload.startswith(TXN_PREFIX):
        return None
    _, attempt, batch, *_ = payload.split(b"|", 3)
    return attempt.decode(), batch.decode()


@dataclass
class TxnAttempt:
    """One process's attempt at a transaction: the batch it commits (a key or app
    version, "-" for none), the ledgers of the segments it opened, its acknowledged
    entries by (ledger, entry id), and its outcome once known (None: pending or
    unknown, e.g. a commit that failed)."""

    batch: str
    txn_id: str
    ledgers: set[int] = field(default_factory=set)
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    outcome: str | None = None


@dataclass
class StreamHistory:
    seed: int
    #: position -> the payload acknowledged there
    acked: dict[Position, bytes] = field(default_factory=dict)
    #: position -> the bytes first seen there, and by whom
    seen: dict[Position, tuple[bytes, str]] = field(default_factory=dict)
    #: every position the subscriber yielded, in its order
    subscribed: list[Position] = field(default_factory=list)
    #: seq -> (ledger id, last entry id once CLOSED) as first seen in a document
    segments: dict[int, tuple[int, int | None]] = field(default_factory=dict)
    #: each takeover: the step it returned at, the taking writer, its first segment,
    #: the writer epoch it took
    takeovers: list[tuple[int, str, int, int]] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    #: transaction attempts by name, their ledgers' owner, and the attempt each batch's
    #: entries were first seen from
    attempts: dict[str, TxnAttempt] = field(default_factory=dict)
    ledger_attempt: dict[int, str] = field(default_factory=dict)
    batch_seen: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    step: int = 0

    def fail(self, what: str) -> None:
        raise InvariantViolation(
            f"{what}\n  seed {self.seed}: replay it with PORA_SIM_SEED={self.seed} "
            "pytest tests/test_stream_simulation.py -k replay\n"
            "  last events:\n    " + "\n    ".join(self.log[-25:])
        )

    def note(self, text: str) -> int:
        self.step += 1
        self.log.append(f"{self.step:5d} t={trio.current_time():9.4f} {text}")
        return self.step

    def failed(self, who: str, error: BaseException) -> None:
        name = type(error).__name__
        self.failures[name] = self.failures.get(name, 0) + 1
        self.note(f"{who} failed: {name}")

    def took_over(self, writer: str, first_segment: int, step: int, epoch: int) -> None:
        """`writer`'s takeover returned at `step` with writer epoch `epoch`; its first
        segment is `first_segment`."""
        self.note(
            f"{writer} took over at step {step}, epoch {epoch}, its first segment {first_segment}"
        )
        self.takeovers.append((step, writer, first_segment, epoch))

    def acknowledged(self, writer: str, position: Position, payload: bytes, started: int) -> None:
        self.note(f"{writer} ack {position}")
        # the epoch the acknowledged writer held when the append started (0: writer-1,
        # whose open is not recorded); every later takeover by another writer fenced it
        own = [t for t in self.takeovers if t[1] == writer and t[0] < started]
        epoch = own[-1][3] if own else 0
        for step, newer, first_segment, newer_epoch in self.takeovers:
            if newer == writer or newer_epoch <= epoch:
                continue
            if started > step:
                self.fail(f"{writer}'s append started after {newer} took over was acknowledged")
            if position.segment >= first_segment:
                self.fail(
                    f"{writer} was acknowledged {position}, in a segment of {newer} (from "
                    f"{first_segment} on)"
                )
        earlier = self.acked.get(position)
        if earlier is not None and earlier != payload:
            self.fail(f"position {position} acknowledged twice with different payloads")
        self.acked[position] = payload
        self._check_bytes(f"acknowledged to {writer}", position, payload)

    def read(self, reader: str, position: Position, payload: bytes) -> None:
        self.note(f"{reader} read {position}")
        self._check_bytes(reader, position, payload)

    def subscriber_got(self, position: Position, payload: bytes) -> None:
        self.note(f"subscriber got {position}")
        if self.subscribed and position <= self.subscribed[-1]:
            self.fail(
                f"the subscriber got {position} after {self.subscribed[-1]}: not each "
                "entry once, in position order"
            )
        self.subscribed.append(position)
        self._check_bytes("subscriber", position, payload)

    # -- transactions ---------------------------------------------------------------

    def txn_begun(self, attempt: str, batch: str, txn_id: str) -> None:
        self.note(f"{attempt} begins transaction {txn_id} (batch {batch})")
        self.attempts[attempt] = TxnAttempt(batch, txn_id)

    def txn_segment(self, attempt: str, ledger_id: int) -> None:
        self.note(f"{attempt} opened a segment on ledger {ledger_id}")
        self.attempts[attempt].ledgers.add(ledger_id)
        self.ledger_attempt[ledger_id] = attempt

    def txn_acked(self, attempt: str, ledger_id: int, entry: int, payload: bytes) -> None:
        self.attempts[attempt].acked[(ledger_id, entry)] = payload

    def txn_ended(self, attempt: str, outcome: str) -> None:
        """`outcome`: committed, skipped (found applied already), aborted, collected."""
        self.note(f"{attempt} {outcome}")
        self.attempts[attempt].outcome = outcome
        if outcome in ENDED_INVISIBLE and self._attempt_seen(attempt):
            self.fail(f"{attempt} was {outcome}, and a reader had got its entries")

    def _attempt_seen(self, attempt: str) -> bool:
        return any(seen == attempt for seen in self.batch_seen.values())

    def _check_txn_entry(self, who: str, payload: bytes) -> None:
        named = txn_of(payload)
        if named is None:
            return
        attempt, batch = named
        known = self.attempts.get(attempt)
        if known is not None and known.outcome in ENDED_INVISIBLE:
            self.fail(f"{who} got an entry of {attempt}, which was {known.outcome}")
        first = self.batch_seen.setdefault(batch if batch != "-" else attempt, attempt)
        if first != attempt:
            self.fail(
                f"{who} got entries of {attempt} and of {first}, both committing batch "
                f"{batch}: applied twice"
            )

    def _check_commits(self, who: str, segments: list[Segment]) -> None:
        """A transaction's segments are visible all together, under one commit number
        that no other transaction's segment has."""
        visible = {segment.ledger_id: segment.commit for segment in segments}
        by_commit: dict[int, str] = {}
        for ledger_id, commit in visible.items():
            attempt = self.ledger_attempt.get(ledger_id)
            if attempt is None:
                continue
            mine = self.attempts[attempt]
            if mine.outcome in ENDED_INVISIBLE:
                self.fail(
                    f"{attempt} was {mine.outcome}, and its ledger {ledger_id} is visible ({who})"
                )
            missing = sorted(mine.ledgers - set(visible))
            if missing:
                self.fail(
                    f"part of {attempt}'s commit is visible: not its ledgers {missing} ({who})"
                )
            other = by_commit.setdefault(commit, attempt)
            if other != attempt:
                self.fail(f"commit {commit} holds segments of {other} and of {attempt} ({who})")

    def check_final_transactions(self, entries: dict[Position, bytes]) -> None:
        """At the end: a transaction with any entry in the final read has all its
        acknowledged entries there; one that ended invisible has none."""
        ledger_of = {seq: ledger for seq, (ledger, _) in self.segments.items()}
        visible = {(ledger_of[p.segment], p.entry): data for p, data in entries.items()}
        for name, attempt in sorted(self.attempts.items()):
            shown = {key for key in visible if key[0] in attempt.ledgers}
            if attempt.outcome in ENDED_INVISIBLE and shown:
                self.fail(f"{name} was {attempt.outcome}, and the final read has its entries")
            if attempt.outcome == "committed" and attempt.ledgers and not shown and attempt.acked:
                self.fail(f"{name} committed, and the final read has none of its entries")
            if shown or attempt.outcome == "committed":
                for key, payload in attempt.acked.items():
                    if visible.get(key) != payload:
                        self.fail(
                            f"{name}: entry {key[1]} of ledger {key[0]} is not in the final read"
                        )

    def _check_bytes(self, who: str, position: Position, payload: bytes) -> None:
        seen = self.seen.get(position)
        if seen is None:
            self.seen[position] = (payload, who)
        elif seen[0] != payload:
            self.fail(
                f"position {position}: {who} has {payload[:40]!r}, {seen[1]} had {seen[0][:40]!r}"
            )
        acked = self.acked.get(position)
        if acked is not None and acked != payload:
            self.fail(f"position {position}: {who} has other bytes than acknowledged")
        self._check_txn_entry(who, payload)

    def document_seen(self, who: str, segments: list[Segment]) -> None:
        """Every segment the document lists (paged ones included), as `who` read it."""
        self._check_commits(who, segments)
        listed = {segment.seq for segment in segments}
        for seq in self.segments:
            if seq not in listed:
                self.fail(f"segment {seq} was in the stream's document and is gone ({who})")
        for segment in segments:
            last = segment.last_entry_id if segment.state is SegmentState.CLOSED else None
            known = self.segments.get(segment.seq)
            if known is None:
                self.segments[segment.seq] = (segment.ledger_id, last)
                continue
            ledger_id, known_last = known
            if ledger_id != segment.ledger_id:
                self.fail(
                    f"segment {segment.seq} moved from ledger {ledger_id} to "
                    f"{segment.ledger_id} ({who})"
                )
            if known_last is not None and last != known_last:
                self.fail(
                    f"segment {segment.seq} closed at entry {known_last}, now "
                    f"{'open' if last is None else last} ({who})"
                )
            if known_last is None and last is not None:
                self.segments[segment.seq] = (ledger_id, last)

    def check_final_read(self, entries: dict[Position, bytes]) -> None:
        """At the end: every acknowledged position yields its payload."""
        for position, payload in sorted(self.acked.items()):
            data = entries.get(position)
            if data is None:
                self.fail(f"position {position} was acknowledged and the final read lacks it")
            elif data != payload:
                self.fail(f"position {position} reads back other bytes than acknowledged")

    def check_subscriber(self, entries: dict[Position, bytes]) -> None:
        """At the end, the subscriber caught up: it got every entry the final read
        yields (so every acknowledged one), each once."""
        got = set(self.subscribed)
        missing = sorted(set(entries) - got)
        if missing:
            self.fail(f"the subscriber never got {[str(p) for p in missing[:10]]}")
        extra = sorted(got - set(entries))
        if extra:
            self.fail(f"the subscriber got {[str(p) for p in extra[:10]]}, not in the stream")
