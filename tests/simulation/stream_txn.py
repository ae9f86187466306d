"""Transactions in the simulated stream runs (tests/simulation/stream_scenarios.py):
processes that begin a transaction, open segments, append, then commit with a key,
an app version or neither, or abort, or die mid-way (their transaction is collected
at the end). Faults of their own: the process dies right after its commit's
compare-and-set took, before the reply (a second attempt of the same batch follows,
which must change nothing), the reply of that compare-and-set is lost (the
committer's re-read finds its commit applied), and crashes or partitions that start
as the commit does. `StreamHistory` (stream_invariants.py) checks what readers see.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import trio

from journal.errors import PoraError
from pora.meta.errors import MetadataTimeout, NoSuchLedgerMetadata
from pora.meta.store import MetadataStore
from pora.streams.document import STREAMS_SPACE, decode_document
from pora.streams.stream import Stream
from pora.streams.transaction import Transaction
from pora.streams.transaction_changes import pending
from simulation.plans import Fault
from simulation.stream_invariants import StreamHistory, txn_payload

if TYPE_CHECKING:
    from simulation.stream_scenarios import StreamSimulation

#: a transaction's entries are small: the runs stay quick
TXN_PAYLOAD_BYTES = 1024
#: every versioned commit names this app id
APP_ID = "sim-app"


@dataclass(frozen=True)
class TxnPlan:
    """One transaction process: starts at `at_s`, opens `segments` segments with
    `appends_each` entries each, then ends as `end` says: "commit", "abort", "crash"
    (dies before committing or aborting), "crash-after-cas" (dies right after its
    commit's compare-and-set took, without the reply; another attempt of the same
    batch follows), "lose-reply" (that compare-and-set's reply is lost). `batch`:
    "key:K", "version:N" (of APP_ID), or "-" (none). `faults` start as it commits."""

    name: str
    at_s: float
    batch: str
    end: str = "commit"
    segments: int = 1
    appends_each: int = 3
    faults: tuple[Fault, ...] = ()


def txn_plans_from_seed(seed: int, nodes: int) -> tuple[TxnPlan, ...]:
    """0 to 4 transaction processes; two may commit one batch (racing drivers)."""
    rng = random.Random(f"{seed}/stream-transactions")
    plans = []
    for index in range(rng.choice([0, 1, 2, 2, 3, 4])):
        name = f"txn-{index + 1}"
        kind = rng.random()
        if kind < 0.4:
            batch = f"key:k{rng.randint(1, 3)}"
        elif kind < 0.8:
            batch = f"version:{rng.randint(1, 4)}"
        else:
            batch = "-"
        end = rng.choice(
            ["commit", "commit", "commit", "abort", "crash", "crash-after-cas", "lose-reply"]
        )
        faults = tuple(
            Fault(
                at_s=0.0,
                kind=rng.choice(["crash", "partition"]),
                node=rng.randrange(nodes),
                for_s=round(rng.uniform(0.05, 0.5), 3),
                client=name,
            )
            for _ in range(rng.choice([0, 0, 1, 2]))
        )
        plans.append(
            TxnPlan(
                name,
                at_s=round(rng.uniform(0.0, 0.4), 4),
                batch=batch,
                end=end,
                segments=rng.randint(1, 3),
                appends_each=rng.randint(0, 4),
                faults=faults,
            )
        )
    return tuple(plans)


class ProcessDied(Exception):
    """The simulated process ends here (not a PoraError: nothing of the client's
    handles it)."""


class DocumentWrites:
    """The metadata store as one simulated client sees it: `took(data)` runs after each
    compare-and-set of the stream's document that took, and may raise in place of the
    reply."""

    def __init__(self, inner: MetadataStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def update_document(
        self, space: str, name: str, data: bytes, expected_version: int
    ) -> Any:
        written = await self._inner.update_document(space, name, data, expected_version)
        if space == STREAMS_SPACE:
            self.took(data, written.version)
        return written

    def took(self, data: bytes, version: int) -> None:
        pass

    def lost_reply(self) -> MetadataTimeout:
        return MetadataTimeout(
            self._inner.url,
            "the update of the stream's document got no answer",
            "simulated: it took, and its reply was lost",
        )


class _TxnHooks(DocumentWrites):
    """A transaction process's store: the compare-and-set that applies its commit (its
    transaction no longer pending in what it wrote) may lose its reply, or end the
    process, as its plan says."""

    def __init__(self, inner: MetadataStore, plan: TxnPlan, history: StreamHistory) -> None:
        super().__init__(inner)
        self._plan = plan
        self._history = history
        #: the transaction being committed, and whether its fault fired
        self.committing: str | None = None
        self.fired = False

    def took(self, data: bytes, version: int) -> None:
        txn_id = self.committing
        if txn_id is None or self.fired or pending(decode_document(data), txn_id) is not None:
            return
        self.fired = True
        if self._plan.end == "crash-after-cas":
            self._history.note(f"{self._plan.name} dies: its commit took, the reply is not read")
            raise ProcessDied
        if self._plan.end == "lose-reply":
            self._history.note(f"{self._plan.name}: its commit took, the reply is lost")
            raise self.lost_reply()


async def run_transaction(run: StreamSimulation, plan: TxnPlan) -> None:
    """The process of `plan`, then, when it died after its commit took, a second
    attempt at its batch (none for a batch without key or version: nothing makes that
    idempotent)."""
    await trio.sleep(plan.at_s)
    died = await _attempt(run, plan, f"{plan.name}.1", plan.end)
    if died and plan.batch != "-":
        await _attempt(run, plan, f"{plan.name}.2", "commit")


async def _attempt(run: StreamSimulation, plan: TxnPlan, attempt: str, end: str) -> bool:
    """One attempt; True when the process died after its commit took."""
    history = run.history
    hooks = _TxnHooks(run.store, TxnPlan(plan.name, plan.at_s, plan.batch, end), history)
    async with run.client(cast(MetadataStore, hooks), plan.name) as client:
        try:
            stream = await client.open_stream(run.stream_name)
            txn = stream.begin()
            history.txn_begun(attempt, plan.batch, txn.id)
            await txn.begin()
            await _write(history, txn, plan, attempt)
            if end == "crash":
                history.note(f"{attempt} dies before its commit: its transaction stays pending")
                return False
            if end == "abort":
                await txn.abort()
                history.txn_ended(attempt, "aborted")
                return False
            for fault in plan.faults:
                run.start_fault(fault)
            hooks.committing = txn.id
            await _commit(history, stream, txn, plan, attempt)
        except ProcessDied:
            return True
        except PoraError as error:
            history.failed(attempt, error)  # its outcome stays unknown
    return False


async def _write(history: StreamHistory, txn: Transaction, plan: TxnPlan, attempt: str) -> None:
    for s in range(plan.segments):
        segment = await txn.open_segment(tags={"attempt": attempt})
        history.txn_segment(attempt, segment.ledger_id)
        for k in range(plan.appends_each):
            payload = txn_payload(attempt, plan.batch, s, k, TXN_PAYLOAD_BYTES)
            entry = await segment.append(payload)
            history.txn_acked(attempt, segment.ledger_id, entry, payload)


async def _commit(
    history: StreamHistory, stream: Stream, txn: Transaction, plan: TxnPlan, attempt: str
) -> None:
    kind, _, value = plan.batch.partition(":")
    if kind == "key":
        number = await txn.commit(key=value)
    elif kind == "version":
        number = await txn.commit(app_id=APP_ID, version=int(value))
    else:
        number = await txn.commit()
    ledgers = history.attempts[attempt].ledgers
    visible = {s.ledger_id for s in (await stream.info()).segments}
    # a commit without segments shows nothing either way: called applied
    applied = not ledgers or bool(ledgers & visible)
    history.note(f"{attempt}: commit {number}")
    history.txn_ended(attempt, "committed" if applied else "skipped")


async def collect_and_check(run: StreamSimulation) -> None:
    """At the end (healed): collect every transaction still pending; their attempts
    are then collected, and their ledgers gone."""
    history = run.history
    async with run.client(run.store, "collector") as client:
        stream = await client.open_stream(run.stream_name)
        pending_ids = {txn.id for txn in (await stream.info()).transactions}
        collected = await stream.collect_abandoned_transactions(idle_s=0)
        history.note(f"collector aborted {len(collected)} abandoned transaction(s)")
        if set(collected) != pending_ids:
            history.fail(f"collected {sorted(collected)}, pending were {sorted(pending_ids)}")
        if (await stream.info()).transactions:
            history.fail("transactions still pending after the collection")
        visible = {s.ledger_id for s in (await stream.info()).segments}
        for name, attempt in sorted(history.attempts.items()):
            if attempt.outcome is not None or attempt.txn_id not in collected:
                continue  # ended, or its commit applied though its reply never came
            if attempt.ledgers & visible:
                history.fail(f"{name}: collected, and its segments are visible")
            history.txn_ended(name, "collected")
            for ledger_id in sorted(attempt.ledgers):
                try:
                    await client.store.read_ledger(ledger_id)
                except NoSuchLedgerMetadata:
                    continue
                history.fail(f"{name}: ledger {ledger_id} is left after its collection")
