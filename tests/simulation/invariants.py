"""What must hold in every run of the simulation, whatever the faults
(docs/replication.md, "What is guaranteed"). `History` calls the step checks as it
records each event, so a violation stops the run at the step that broke it; the end
checks run once the network is healed and the ledger read back.

- no acknowledged entry is lost: every acknowledged entry is in the closed ledger
  with its bytes (checked at each close, and against the read-back at the end);
- no two readers see different bytes at one id, nor other bytes than acknowledged;
- a fenced writer gets no acknowledgement after its fence: once an append failed
  with LedgerFenced, no entry above the writer's LAC of that moment is acknowledged,
  and no append started later succeeds;
- a closed ledger's last entry never moves;
- R26: once a delete returned, its fence had covered the ensemble: no append started
  later succeeds, nor any entry the writer had not issued by then (one pending may
  still complete when a fenced member took its entry before its fence and a slow,
  unfenced one answers late: as after a recovery's fence, R17); a writer that had not
  failed before the delete fails every append from then on with LedgerDeleted; and
  the auditor finds no ledger to open, nor a node that took the delete holding it
  again;
- R20: a recovered entry is held, with its bytes, by every member of its write set
  that took the recovery's add, and by at least Qa members (less those wiped);
- R8's backlog bound: whenever the writer queues a batch for a node, what it holds
  queued for that node is at most `node_backlog_bytes_max` beyond the client's
  pending bytes (a node further behind is failed and its queue dropped).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulation.history import History


class InvariantViolation(AssertionError):
    """A guarantee of docs/replication.md broken in a simulated run: a client bug."""


def fail(history: History, what: str) -> None:
    raise InvariantViolation(
        f"{what}\n  seed {history.seed}: replay it with "
        f"PORA_SIM_SEED={history.seed} pytest tests/test_simulation.py -k replay\n"
        f"  last events:\n    " + "\n    ".join(history.log[-25:])
    )


def check_ack(
    history: History, writer: str, ledger_id: int, entry_id: int, payload: bytes, started: int
) -> None:
    key = (ledger_id, entry_id)
    earlier = history.acked.get(key)
    if earlier is not None and earlier != payload:
        fail(
            history, f"ledger {ledger_id} entry {entry_id} acknowledged twice with different bytes"
        )
    fence = history.fenced_at.get(writer)
    if fence is not None:
        lac_at_fence, fence_step = fence
        if entry_id > lac_at_fence:
            fail(
                history,
                f"writer {writer} acknowledged entry {entry_id} of ledger {ledger_id} after its "
                f"fence (its LAC was {lac_at_fence} when an append failed with LedgerFenced)",
            )
        if started > fence_step:
            fail(
                history,
                f"writer {writer}: an append started after LedgerFenced was acknowledged "
                f"(entry {entry_id} of ledger {ledger_id})",
            )
    deleted = history.deleted_at.get(writer)
    if deleted is not None and (entry_id > deleted[0] or started > deleted[1]):
        fail(
            history,
            f"writer {writer} acknowledged entry {entry_id} of ledger {ledger_id}, appended "
            f"after the delete returned (it had issued entries up to {deleted[0]} then): "
            "the delete's fence did not stop it",
        )
    closed = history.closed.get(ledger_id)
    if closed is not None and entry_id > closed[0]:
        fail(
            history,
            f"ledger {ledger_id} entry {entry_id} acknowledged to {writer}, but the ledger "
            f"closed at {closed[0]}: an acknowledged entry is lost",
        )
    check_bytes(history, f"acknowledged to {writer}", ledger_id, entry_id, payload)


def check_bytes(history: History, who: str, ledger_id: int, entry_id: int, data: bytes) -> None:
    """One id, one payload: for every reader, and the writer's acknowledged bytes."""
    key = (ledger_id, entry_id)
    seen = history.seen.get(key)
    if seen is None:
        history.seen[key] = (data, who)
    elif seen[0] != data:
        fail(
            history,
            f"ledger {ledger_id} entry {entry_id}: {who} has {data[:40]!r}, "
            f"{seen[1]} had {seen[0][:40]!r}",
        )


def check_fence(history: History, writer: str, lac: int) -> None:
    """The writer's LAC once fenced never grows."""
    fence = history.fenced_at.get(writer)
    if fence is not None and lac > fence[0]:
        fail(history, f"writer {writer}'s LAC grew from {fence[0]} to {lac} after its fence")


def check_deleted_writer(history: History, error: BaseException) -> None:
    """R26: an append failing after the delete returned fails with LedgerDeleted,
    unless the writer had already failed before (its first error sticks: a recovery
    racing the delete may have fenced it first)."""
    deleted = next(iter(history.deleted_at.values()), None)
    if deleted is None:
        return
    first = history.writer_first_failure
    if first is not None and first[0] < deleted[1]:
        return  # it failed before the delete returned: that error sticks, whichever
    if type(error).__name__ != "LedgerDeleted":
        fail(
            history,
            f"the writer's append failed with {type(error).__name__} after its ledger "
            "was deleted: expected LedgerDeleted",
        )


def check_close(
    history: History, who: str, ledger_id: int, last_entry_id: int, length: int
) -> None:
    closed = history.closed.get(ledger_id)
    if closed is not None and closed != (last_entry_id, length):
        fail(
            history,
            f"ledger {ledger_id}: {who} sees it closed at entry {last_entry_id} (length "
            f"{length}), it was closed at {closed[0]} (length {closed[1]}): the closed "
            "last entry moved",
        )
    for (acked_ledger, entry_id), _payload in history.acked.items():
        if acked_ledger == ledger_id and entry_id > last_entry_id:
            fail(
                history,
                f"ledger {ledger_id} closed at {last_entry_id} by {who}, but entry {entry_id} "
                "was acknowledged: an acknowledged entry is lost",
            )


def check_read_back(history: History, ledger_id: int, entries: dict[int, bytes]) -> None:
    """At the end: every acknowledged entry reads back with its bytes."""
    for (acked_ledger, entry_id), payload in sorted(history.acked.items()):
        if acked_ledger != ledger_id:
            continue
        data = entries.get(entry_id)
        if data is None:
            fail(history, f"ledger {ledger_id} entry {entry_id} was acknowledged and is lost")
        elif data != payload:
            fail(
                history,
                f"ledger {ledger_id} entry {entry_id} reads back other bytes than acknowledged",
            )


def check_backlog(history: History, address: str, queued: int, pending: int, bound: int) -> None:
    """What the writer holds queued for one node, right after it queued a batch."""
    if queued - pending > bound:
        fail(
            history,
            f"the writer holds {queued} bytes queued for node {address}, more than "
            f"node_backlog_bytes_max ({bound}) beyond its {pending} pending bytes",
        )
