"""Recovery of a ledger whose writer is gone (R16..R22): mark it in recovery, fence
the last ensemble, find its last entry by fencing reads, copy every recovered entry to
its whole write set, close the record with a compare-and-set, seal the nodes.

The decisions are the deterministic core's (`FenceCoverage`, `recovery_start`,
`EntryRecoveryVote`, `ledger_records`); this module only does the I/O they ask for.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence

import anyio

from journal.errors import PoraError
from ledger.errors import NoSuchEntry, NoSuchLedger
from netio.errors import InstanceMismatch
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import ReplicatedEntry
from pora.client.replication.core.ledger_records import (
    RecoveryRetry,
    check_password,
    closed_at,
    in_recovery,
    recovery_after_conflict,
    recovery_ensemble,
    with_ensemble_change,
)
from pora.client.replication.core.placement import choose_replacements
from pora.client.replication.core.recovery_votes import (
    EntryRecoveryVote,
    FenceCoverage,
    VoteOutcome,
    recovery_start,
    recovery_vote,
)
from pora.client.replication.errors import NotEnoughNodes, RecoveryFailed
from pora.client.replication.recovery_adds import STRAGGLER_GRACE_S, add_recovered
from pora.client.replication.replica_reads import (
    AllAnsweredNoSuchEntry,
    ChannelFor,
    read_from_write_set,
)
from pora.meta.errors import MetadataVersionConflict
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata, LedgerState, Versioned
from pora.meta.store import MetadataStore

log = logging.getLogger(__name__)

#: entries whose fencing reads are in flight at once (R19 pipelining)
READ_AHEAD = 8
#: a member that refused a fencing read is asked again after this, doubling
FENCE_RETRY_DELAY_S = 0.05


async def recover_ledger(
    store: MetadataStore,
    channel_for: ChannelFor,
    config: ClientConfig,
    ledger_id: int,
    master_key: bytes,
    rng: random.Random | None = None,
) -> Versioned[LedgerMetadata]:
    """Close the ledger at its last recoverable entry and return the CLOSED record
    (another recovery's, when that one closed it first). Unauthorized for a wrong
    key; RecoveryFailed (the record left IN_RECOVERY) when too few nodes answer.
    `rng` breaks ties when a member is replaced (R1)."""
    while True:
        current = await store.read_ledger(ledger_id)
        check_password(current.value, master_key)
        if current.value.state is LedgerState.CLOSED:
            return current  # R16: nothing to do
        if current.value.state is LedgerState.OPEN:
            try:
                current = await store.update_ledger(in_recovery(current.value), current.version)
            except MetadataVersionConflict:
                continue  # R16: start again from the read
        # R16: IN_RECOVERY (ours, or another recovery's, perhaps dead): go on; only the
        # final compare-and-set decides (R22)
        run = Recovery(channel_for, config, current, master_key, store, rng or random.Random())
        try:
            last_entry_id, length = await run.find_and_copy_tail()
            closed = await store.update_ledger(
                closed_at(run.record.value, last_entry_id, length), run.record.version
            )
        except (MetadataVersionConflict, _RecordMoved):
            reread = await store.read_ledger(ledger_id)
            if recovery_after_conflict(reread) is RecoveryRetry.CLOSED:
                return reread  # R22: another recovery closed it; that result stands
            continue  # the record moved (an ensemble change): start again
        except RecoveryFailed:
            # a racing recovery that closed the ledger first seals its nodes, which
            # then refuse this one's re-adds: its close is the result (R22)
            reread = await store.read_ledger(ledger_id)
            if recovery_after_conflict(reread) is RecoveryRetry.CLOSED:
                return reread
            raise
        await run.seal(closed.value.last_entry_id)
        return closed


class _RecordMoved(Exception):
    """Another process changed the record while this recovery replaced a member."""


class Recovery:
    """One pass over one version of an IN_RECOVERY record (a delete uses its fence)."""

    def __init__(
        self,
        channel_for: ChannelFor,
        config: ClientConfig,
        record: Versioned[LedgerMetadata],
        master_key: bytes,
        store: MetadataStore | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.channel_for = channel_for
        self.config = config
        self.record = record
        #: the record the adds follow (a member replaced while re-adding moves it);
        #: fencing and the votes follow its writer's view (`writer_view`): the
        #: members the old writer wrote to, never one that joined in a recovery and
        #: holds only what recoveries gave it (its "no such entry" proves nothing)
        self.metadata = record.value
        self.ledger_id = record.value.ledger_id
        self.master_key = master_key
        self.store = store
        self.rng = rng or random.Random()
        self.last_ensemble: Ensemble = record.value.ensembles[-1]
        self.failed_members: set[EnsembleMember] = set()

    async def find_and_copy_tail(self) -> tuple[int, int]:
        """R17..R21: `(last entry id, length)` of the recovered ledger, every recovered
        entry on its whole write set (at least Qa members of it)."""
        lacs = await self.fence()
        start = recovery_start(lacs, self.last_ensemble)  # R18 (#2615)
        last_entry_id, length = start - 1, None
        next_id = start
        while True:
            votes = await self._vote_window(next_id)
            present: list[ReplicatedEntry] = []
            for vote in votes:
                if vote.entry is None:  # ABSENT: the ledger ends before it (R19)
                    break
                present.append(vote.entry)
            if present:
                await self.copy(present)
                last_entry_id, length = present[-1].entry_id, present[-1].length_after
            if len(present) < len(votes):
                break
            next_id += len(votes)
        if length is None:
            length = await self._length_through(last_entry_id)
        return last_entry_id, length

    async def fence(self) -> list[int]:
        """R17: fencing LAC reads to every member of the last ensemble the old writer
        wrote to (the writer's view: a member that joined in an earlier recovery never
        heard from the writer, so fencing it stops nothing) in parallel, until they
        cover it; returns the LACs the fenced members reported. A member that never
        answers does not hold this up once the others cover."""
        writers = self.metadata.writer_view().ensembles[-1]
        coverage = FenceCoverage(writers, self.metadata.write_quorum, self.metadata.ack_quorum)
        lacs: list[int] = []
        failures: dict[str, str] = {}

        async def fence_member(member: EnsembleMember) -> None:
            for attempt in range(self.config.recovery_attempts_max):
                try:
                    with anyio.fail_after(self.config.node_timeout_s):
                        channel = await self.channel_for(member.address)
                        # no instance id: a wiped node fences the ledger like any other
                        lac, _ = await channel.read_lac(
                            self.ledger_id,
                            fence_key=self.master_key,
                            timeout_s=self.config.node_timeout_s,
                        )
                except TimeoutError:
                    failures[member.address] = f"no answer in {self.config.node_timeout_s} s"
                    continue
                except PoraError as error:
                    failures[member.address] = f"{type(error).__name__}: {error}"
                    await anyio.sleep(FENCE_RETRY_DELAY_S * 2**attempt)
                    continue
                failures.pop(member.address, None)
                lacs.append(lac)
                if coverage.record_fenced(member.address):
                    group.cancel_scope.cancel()
                return

        with anyio.move_on_after(self.config.recovery_fence_timeout_s):
            async with anyio.create_task_group() as group:
                for member in writers.members:
                    group.start_soon(fence_member, member)
        if not coverage.covered:
            short = "; ".join(
                "[" + ", ".join(m.address for m in write_set) + "]"
                for write_set in coverage.uncovered_write_sets()
            )
            why = "; ".join(f"{a}: {w}" for a, w in sorted(failures.items()))
            raise RecoveryFailed(
                self.ledger_id,
                f"fencing did not cover the last ensemble: write sets {short} have fewer "
                f"than {coverage.needed} fenced members ({why or 'no answer in time'})",
            )
        return lacs

    async def _vote_window(self, first_id: int) -> list[EntryRecoveryVote]:
        """R19 for entries first_id .. first_id + READ_AHEAD - 1 at once; their votes in
        order, up to and including the first ABSENT one. An entry after an absent one
        that could not be decided does not fail the recovery."""
        votes: list[EntryRecoveryVote | RecoveryFailed | None] = [None] * READ_AHEAD

        async def decide(k: int) -> None:
            try:
                votes[k] = await self.vote(first_id + k)
            except RecoveryFailed as error:
                votes[k] = error

        async with anyio.create_task_group() as group:
            for k in range(READ_AHEAD):
                group.start_soon(decide, k)
        decided: list[EntryRecoveryVote] = []
        for vote in votes:
            if not isinstance(vote, EntryRecoveryVote):
                assert vote is not None
                raise vote
            decided.append(vote)
            if vote.outcome is VoteOutcome.ABSENT:
                break
        return decided

    async def vote(self, entry_id: int) -> EntryRecoveryVote:
        """R19: fencing reads of one entry to its write set until it is present or
        absent; asks the undecided members again (bounded), then RecoveryFailed."""
        vote = recovery_vote(self.metadata, entry_id)
        members = vote.members_to_ask()
        undecided: dict[str, str] = {}
        for _ in range(self.config.recovery_attempts_max):
            async with anyio.create_task_group() as group:
                for member in members:

                    async def ask(member: EnsembleMember = member) -> None:
                        await self._ask(vote, member)
                        if vote.outcome in (VoteOutcome.PRESENT, VoteOutcome.ABSENT):
                            # #1067: the rest need not answer (a hung one never does)
                            group.cancel_scope.cancel()

                    group.start_soon(ask)
            if vote.outcome in (VoteOutcome.PRESENT, VoteOutcome.ABSENT):
                return vote
            undecided = vote.undecided
            members = vote.ask_again()
        why = "; ".join(f"{a}: {w}" for a, w in sorted(undecided.items()))
        raise RecoveryFailed(
            self.ledger_id,
            f"entry {entry_id} is neither present nor absent after "
            f"{self.config.recovery_attempts_max} attempts: {len(vote.negatives)} of the "
            f"{vote.needed} 'no such entry' answers needed ({why})",
        )

    async def _ask(self, vote: EntryRecoveryVote, member: EnsembleMember) -> None:
        try:
            with anyio.fail_after(self.config.node_timeout_s):
                channel = await self.channel_for(member.address)
                # #2614: every recovery read fences, so a node that says "no such entry"
                # refuses that entry from the old writer forever after
                data, _ = await channel.read_entry(
                    self.ledger_id,
                    vote.entry_id,
                    fence_key=self.master_key,
                    instance_id=member.instance_id,
                    timeout_s=self.config.node_timeout_s,
                )
        except (NoSuchEntry, NoSuchLedger):
            vote.record_no_such_entry(member.address, member.instance_id)
        except InstanceMismatch as error:
            # #2612: a wiped node never held what the old instance did: unknown
            vote.record_error(member.address, f"another instance: {error}")
        except TimeoutError:
            vote.record_error(member.address, f"no answer in {self.config.node_timeout_s} s")
        except PoraError as error:
            # #2908: CORRUPT (StorageCorruption) and every error are unknown, never absent
            vote.record_error(member.address, f"{type(error).__name__}: {error}")
        else:
            vote.record_entry(member.address, member.instance_id, data)
            for address, damage in vote.damaged:
                log.warning("recovery: replica %s: %s", address, damage)

    async def copy(self, entries: Sequence[ReplicatedEntry]) -> None:
        """R20: add the recovered entries again, RECOVERY flag, to their whole write
        set; each must reach Qa members. Members whose adds failed (so that an entry
        fell short) are replaced as in R9, keeping the record IN_RECOVERY: the entries
        go to the new write sets first, and the new ensemble is written to the record
        (compare-and-set) only once each holds them on Qa members, so a record never
        names a replacement that lacks what a later recovery would look for."""
        first = entries[0].entry_id
        metadata = self.metadata
        for _ in range(self.config.recovery_attempts_max):
            outcome = await add_recovered(
                self.channel_for, self.config, metadata, self.master_key, entries
            )
            if not outcome.short:
                if metadata is not self.metadata:
                    await self._commit(metadata)
                return
            metadata = await self._replaced(metadata, outcome.failed, first, outcome.why())
        raise RecoveryFailed(
            self.ledger_id,
            f"entries {first}..{entries[-1].entry_id} could not be stored again on "
            f"Qa={metadata.ack_quorum} members after {self.config.recovery_attempts_max} "
            "ensembles",
        )

    async def _replaced(
        self, metadata: LedgerMetadata, failed: set[EnsembleMember], first: int, why: str
    ) -> LedgerMetadata:
        """R9 for a recovery: `metadata` with a last ensemble from `first` on, its
        failed members replaced (never by a member that failed for this ledger; a new
        instance at its address may be)."""
        self.failed_members.update(failed)
        last = metadata.ensembles[-1]
        in_last = failed.intersection(last.members)
        if self.store is None or not in_last:
            raise RecoveryFailed(self.ledger_id, f"re-adding recovered entries failed: {why}")
        try:
            replacements = choose_replacements(
                await self.store.list_nodes(writable_only=True),
                last.members,
                in_last,
                self.rng,
                excluded=self.failed_members,
            )
        except NotEnoughNodes as error:
            raise RecoveryFailed(
                self.ledger_id, f"re-adding recovered entries failed ({why}) and {error}"
            ) from error
        log.warning(
            "recovery of ledger %d: replacing %s by %s from entry %d (%s)",
            self.ledger_id,
            sorted(m.address for m in replacements),
            sorted(m.address for m in replacements.values()),
            first,
            why,
        )
        return with_ensemble_change(metadata, recovery_ensemble(last, first, replacements))

    async def _commit(self, metadata: LedgerMetadata) -> None:
        assert self.store is not None
        try:
            self.record = await self.store.update_ledger(metadata, self.record.version)
        except MetadataVersionConflict as conflict:
            raise _RecordMoved from conflict
        self.metadata = metadata
        self.last_ensemble = metadata.ensembles[-1]

    async def _length_through(self, last_entry_id: int) -> int:
        """R21: the ledger's length when no entry was recovered: `length_after` of the
        entry before the first one read (acknowledged, so readable), or 0."""
        if last_entry_id < 0:
            return 0
        # the writer's members, then those that joined in a recovery (any copy will do)
        vote = recovery_vote(self.metadata, last_entry_id)
        write_set = vote.write_set + vote.joined
        try:
            answer = await read_from_write_set(
                self.channel_for,
                self.config,
                self.ledger_id,
                last_entry_id,
                write_set,
                token=self.metadata.token,
            )
        except AllAnsweredNoSuchEntry as error:
            raise RecoveryFailed(
                self.ledger_id,
                f"entry {last_entry_id}, acknowledged, is on none of {error.members}",
            ) from error
        except PoraError as error:
            raise RecoveryFailed(self.ledger_id, str(error)) from error
        return answer.entry.length_after

    async def seal(self, last_entry_id: int) -> None:
        """R22: seal the last ensemble's nodes at the last entry (best effort: the
        record is the truth)."""

        async def seal_member(member: EnsembleMember) -> None:
            try:
                with anyio.fail_after(self.config.node_timeout_s):
                    channel = await self.channel_for(member.address)
                    await channel.close_ledger(
                        self.ledger_id,
                        last_entry_id,
                        master_key=self.master_key,
                        instance_id=member.instance_id,
                        timeout_s=self.config.node_timeout_s,
                    )
            except (PoraError, TimeoutError) as error:
                log.info("ledger %d: sealing on %s failed: %s", self.ledger_id, member, error)

        with anyio.move_on_after(min(self.config.node_timeout_s, STRAGGLER_GRACE_S)):
            async with anyio.create_task_group() as group:
                for member in self.last_ensemble.members:
                    group.start_soon(seal_member, member)
