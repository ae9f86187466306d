"""Typed errors of the replicating client's core; `pora.errors` re-exports them."""

from __future__ import annotations

from journal.errors import PoraError


class NotEnoughNodes(PoraError):
    """Placement found fewer writable live nodes than an ensemble needs (R2, R12)."""

    def __init__(self, found: int, needed: int, excluded: int = 0) -> None:
        self.found = found
        self.needed = needed
        #: candidates left out on purpose (current members, nodes that failed)
        self.excluded = excluded
        besides = f" besides {excluded} excluded" if excluded else ""
        super().__init__(
            f"placement needs {needed} writable live node(s){besides} but found {found}: "
            "start or register more nodes (pora serve --metadata URL), free a read-only "
            "node's disk, or ask for a smaller ensemble"
        )


class EntryDamaged(PoraError):
    """A replicated entry's bytes do not match their header or checksum: the replica
    that sent them is not to be believed for this entry; read another replica."""

    def __init__(self, ledger_id: int, entry_id: int, what: str) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.what = what
        super().__init__(
            f"entry {entry_id} of ledger {ledger_id} is damaged: {what}; "
            "the replica that returned it must not be trusted for it (read another one, "
            "and run `pora verify` on that node)"
        )


class EntryLost(PoraError):
    """R24: every member of an entry's write set answered "no such entry" for an entry
    at or below the ledger's LAC (or closed last entry): it was acknowledged and no
    replica holds it any more. Not "no such entry": the ledger claims it."""

    def __init__(self, ledger_id: int, entry_id: int, members: list[str]) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.members = members
        super().__init__(
            f"entry {entry_id} of ledger {ledger_id} was acknowledged but none of its "
            f"replicas ({', '.join(members)}) holds it: the data is lost unless one of "
            "those nodes' data dirs can be restored; check their logs and `pora verify`"
        )


class EntryUnreadable(PoraError):
    """R24: no member of an entry's write set gave a valid copy (errors, timeouts,
    damaged copies, replaced data dirs); `answers` says what each one did."""

    def __init__(self, ledger_id: int, entry_id: int, answers: dict[str, str]) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.answers = answers
        why = "; ".join(f"{address}: {answer}" for address, answer in answers.items())
        super().__init__(
            f"entry {entry_id} of ledger {ledger_id} could not be read from any replica "
            f"({why}); retry once those nodes are reachable"
        )


class RecoveryFailed(PoraError):
    """A recovery could not finish (R17, R19, R20); the record stays IN_RECOVERY and
    another `open_ledger(recover=True)` retries it."""

    def __init__(self, ledger_id: int, what: str) -> None:
        self.ledger_id = ledger_id
        self.what = what
        super().__init__(
            f"recovery of ledger {ledger_id} failed: {what}; the ledger stays in recovery: "
            "bring those nodes back (or wait for them) and open it with recover=True again"
        )


class DeleteFailed(PoraError):
    """R26: a delete could not fence the ledger's last ensemble; the record stays
    marked deleting (its writer is refused any ensemble change) and a retry of the
    delete finishes it."""

    def __init__(self, ledger_id: int, what: str) -> None:
        self.ledger_id = ledger_id
        self.what = what
        super().__init__(
            f"delete of ledger {ledger_id} could not fence its writer: {what}; the record "
            "is kept, marked deleting: bring those nodes back (or wait for them) and call "
            "delete_ledger again"
        )


class ClientClosed(PoraError):
    """The client ended (its `async with pora.connect(...)` block was left): its
    writers take no more appends (one pending then has an unknown outcome), its
    readers no more reads or tails, and it opens, creates and deletes no ledgers.
    `ledger_id` names the writer's or the reader's ledger, None for a call on the
    client itself."""

    def __init__(self, ledger_id: int | None, what: str | None = None) -> None:
        self.ledger_id = ledger_id
        if what is None:  # a writer's
            what = (
                "the writer takes no more appends, and one pending then has an unknown "
                "outcome (open the ledger with recovery to learn what it holds)"
            )
        where = "the client" if ledger_id is None else f"ledger {ledger_id}: its client"
        super().__init__(f"{where} was closed: {what} (connect again to go on)")
