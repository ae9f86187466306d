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
  same ledger and, once CLOSED, with the same last entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from pora.streams.document import Segment, SegmentState
from pora.streams.position import Position
from simulation.invariants import InvariantViolation


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
    #: the step a takeover returned at, the taking writer, its first segment
    takeover: tuple[int, str, int] | None = None
    failures: dict[str, int] = field(default_factory=dict)
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

    def took_over(self, writer: str, first_segment: int, step: int) -> None:
        """`writer`'s takeover returned at `step`; its first segment is `first_segment`."""
        self.note(f"{writer} took over at step {step}, its first segment {first_segment}")
        self.takeover = (step, writer, first_segment)

    def acknowledged(self, writer: str, position: Position, payload: bytes, started: int) -> None:
        self.note(f"{writer} ack {position}")
        if self.takeover is not None and self.takeover[1] != writer:
            step, newer, first_segment = self.takeover
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

    def document_seen(self, who: str, segments: list[Segment]) -> None:
        """Every segment the document lists (paged ones included), as `who` read it."""
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
