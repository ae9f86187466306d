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
