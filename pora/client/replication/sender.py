"""A ledger writer's sender (R3, R4, R8, R10, R13): the ledger's side of the
client's node senders (`node_senders.py`). Each scheduler turn with work, the
client's dispatch takes this ledger's turn: the batches its `PendingAdds` returns
(one per member, R3, plus the resends of a replacement, R10), handed to each
member's node queue, which carries every ledger's batch for that node in one call.
A turn never waits for the previous turn's answers. Answers go back to the
`PendingAdds` as plain calls; what it says became acknowledged goes to the writer
(`WriterOutcomes`); a failed call fails the member (the ensemble changer's
business), a refusal of the ledger ends the writer (R13, sorted by
core/refusals.py). The sender holds no state of
the ledger's adds: only its own turn's scheduling and its calls in flight.
"""

from __future__ import annotations

import logging

import anyio

from journal.errors import PoraError
from pora.client.node_channel import AddAnswer
from pora.client.replication.core.pending_adds import Batch, PendingAdds
from pora.client.replication.core.refusals import EndWriter, first_refusal, sort_refusal
from pora.client.replication.ensemble_change import EnsembleChanger, WriterContext, WriterOutcomes
from pora.meta.records import EnsembleMember

_log = logging.getLogger("pora.client.writer")


class Sender:
    def __init__(
        self,
        adds: PendingAdds,
        context: WriterContext,
        master_key: bytes,
        changer: EnsembleChanger,
        outcomes: WriterOutcomes,
    ) -> None:
        self._adds = adds
        self._master_key = master_key
        self._changer = changer
        self._outcomes = outcomes
        self._senders = context.senders
        self._scheduled = False  # a turn is due in the client's next dispatch
        self._stopped = False
        self._in_flight = 0  # batches submitted and not answered
        self._calls_done: anyio.Event | None = None  # made only when a close waits

    @property
    def ledger_id(self) -> int:
        return self._adds.ledger_id

    @property
    def master_key(self) -> bytes:
        return self._master_key

    def wake(self) -> None:
        """Take a turn soon (at most one per scheduler turn however often it is asked)."""
        if not self._scheduled:
            self._scheduled = True
            self._senders.schedule(self)

    def stop(self) -> None:
        """The writer stopped: no more turns, late answers are ignored."""
        self._stopped = True

    async def calls_done(self) -> None:
        """Wait until no add call is in flight."""
        if self._in_flight:
            if self._calls_done is None:
                self._calls_done = anyio.Event()
            await self._calls_done.wait()

    # -- the node senders' side (node_senders.LedgerTurns) ------------------------------

    def take_turn(self) -> None:
        """Hand the turn's batches to the node senders."""
        self._scheduled = False
        if self._stopped:
            return
        senders = self._senders
        for member, entries, size in self._adds.take_batches():
            self._in_flight += 1
            senders.submit(self, member, entries, size)

    def sends_to(self, member: EnsembleMember) -> bool:
        return not self._stopped and self._adds.sends_to(member)

    def issued_lac(self) -> int:
        return self._adds.last_add_confirmed

    def answer(self, member: EnsembleMember, entries: Batch, lac: int, answer: AddAnswer) -> None:
        if self._stopped:
            return
        if isinstance(answer, BaseException):
            self._changer.member_failed(member, answer)  # R8
            return
        adds = self._adds
        if answer is not None:  # an outcome per entry: some entry failed
            refusal = first_refusal(answer)
            if refusal is not None:
                adds.answered(lac)
                self._refused(member, refusal)
                return
        released = adds.acked(member, entries, lac)
        if released.ids:
            self._outcomes.appends_acknowledged(released)

    def call_finished(self) -> None:
        self._in_flight -= 1
        if not self._in_flight and self._calls_done is not None:
            self._calls_done.set()
            self._calls_done = None

    def _refused(self, member: EnsembleMember, error: PoraError) -> None:
        """Act on R13's sorting of a refusal (core/refusals.py)."""
        verdict = sort_refusal(self.ledger_id, error)
        if isinstance(verdict, EndWriter):
            if verdict.misuse:
                _log.error("ledger %d: node %s refused an entry: %s", self.ledger_id, member, error)
            self._outcomes.writer_failed(verdict.error)
        else:
            self._changer.member_failed(member, verdict.error)
