"""Every ledger's master key, and the check of requests against it: one owner.

A key is fixed by the first add, fence or close of a ledger and journalled (a KEY
record) before that request; requests claiming another key are refused before
they reach the journal. The node checks through `admit`; the ledger worker
`forget`s a deleted ledger's key; recovery `restore`s what replay and the index
hold.

A request that would give a ledger its first key creates the ledger on this node:
there, and only there (not per entry), the ledger's tombstone is looked up, so a
ledger this node deleted is never created again by its writer's late adds, a fence
or a close (ledger ids are never reused). Between a delete's apply and the index
batch that writes its tombstone, the id is held in memory (`deleting`).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Mapping

from journal.format import RecordKind
from journal.request import Request
from ledger.errors import LedgerClosed, LedgerDeleted, Unauthorized
from ledger.state import LedgerMeta, LedgerState


class LedgerKeys:
    def __init__(self, tombstoned: Callable[[int], bool] = lambda ledger_id: False) -> None:
        self._keys: dict[int, bytes] = {}
        #: the index's tombstone lookup (Index.is_deleted)
        self._tombstoned = tombstoned
        #: ledgers deleted whose tombstone is not in the index yet (a few at a time:
        #: each leaves once its worker's index batch is written)
        self._deleting: set[int] = set()

    def restore(self, keys: Iterable[tuple[int, bytes]]) -> None:
        """Keys known from before the node started (the index, journal replay)."""
        self._keys.update(keys)

    def forget(self, ledger_id: int) -> None:
        """The ledger is deleted: its key goes, and the id is refused from now on."""
        self._keys.pop(ledger_id, None)
        self._deleting.add(ledger_id)

    def tombstone_written(self, ledger_id: int) -> None:
        """The index holds the deleted ledger's tombstone: the memory copy may go."""
        self._deleting.discard(ledger_id)

    def deleted(self, ledger_id: int) -> bool:
        """Whether this node deleted the ledger (ask only where it would be created)."""
        return ledger_id in self._deleting or self._tombstoned(ledger_id)

    def key_of(self, ledger_id: int) -> bytes:
        """The ledger's master key; empty when it has none (no keyed request yet)."""
        return self._keys.get(ledger_id, b"")

    def matches(self, ledger_id: int, claimed: bytes) -> bool:
        """True unless the ledger has a key and `claimed` is not it."""
        known = self._keys.get(ledger_id)
        return known is None or hmac.compare_digest(known, claimed)

    def admit(self, requests: list[Request], metas: Mapping[int, LedgerMeta]) -> list[Request]:
        """The requests to journal: those with the right key (or none to check), each
        ledger's first key fixed by a KEY record put before its first request.

        Requests with a wrong key, adds to a closed ledger (checked here to keep
        to one pass over the batch), and any keyed request to a ledger this node
        deleted (LedgerDeleted, looked up only for a ledger with no key) are failed
        and left out. Returns `requests`
        itself when nothing changes (the common case: no list is made).
        """
        keys = self._keys
        checked: list[Request] | None = None  # made only when the batch must change
        for index, request in enumerate(requests):
            claimed = request.master_key
            if claimed is None:
                if checked is not None:
                    checked.append(request)
                continue
            if request.kind is RecordKind.ENTRY:
                # (a close still in the journal is met by the ledger worker's own check)
                meta = metas.get(request.ledger_id)
                if meta is not None and meta.state is LedgerState.CLOSED:
                    if checked is None:
                        checked = requests[:index]
                    request.fail(LedgerClosed(request.ledger_id))
                    continue
            known = keys.get(request.ledger_id)
            if known is not None and (known is claimed or hmac.compare_digest(known, claimed)):
                if checked is not None:
                    checked.append(request)
                continue
            if checked is None:
                checked = requests[:index]
            if known is None and self.deleted(request.ledger_id):
                request.fail(LedgerDeleted(request.ledger_id, " on this node"))
            elif known is None:
                keys[request.ledger_id] = claimed
                checked.append(Request(RecordKind.KEY, request.ledger_id, -1, claimed))
                checked.append(request)
            else:
                request.fail(Unauthorized(request.ledger_id))
        return requests if checked is None else checked
