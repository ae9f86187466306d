"""A recovery racing a writer's ensemble change (the scenario BookKeeper's published
TLA+ analysis found), over the core's pieces: the writer's AckTracker, placement's
replacements, the metadata's compare-and-set as a version check, FenceCoverage,
recovery_start and EntryRecoveryVote. Nodes refuse the old writer once fenced;
deliveries, changes landing and recovery steps interleave as hypothesis draws."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pora.client.replication.core.entry_format import encode_entry
from pora.client.replication.core.quorum import AckTracker, write_set
from pora.client.replication.core.recovery_votes import (
    EntryRecoveryVote,
    FenceCoverage,
    VoteOutcome,
    recovery_start,
)
from pora.meta.records import Ensemble, EnsembleMember


def m(i: int) -> EnsembleMember:
    return EnsembleMember(f"n{i}:3181", f"inst-{i}")


class Cluster:
    """Nodes, the metadata's ensembles, and the writer with its messages in flight."""

    def __init__(self, e: int, qw: int, qa: int, data: st.DataObject) -> None:
        self.qw, self.qa, self.data = qw, qa, data
        first = Ensemble(0, tuple(m(i) for i in range(e)))
        self.ensembles = [first]  # what the metadata holds
        self.in_recovery = False
        self.writer = AckTracker(1, qw, qa, first)
        self.unwritten: Ensemble | None = None  # the writer's change not yet landed
        self.stored: dict[str, dict[int, bytes]] = {}
        self.lac_seen: dict[str, int] = {}
        self.fenced: set[str] = set()
        self.in_flight: list[tuple[int, EnsembleMember]] = []
        self.fresh = e

    def node(self, address: str) -> dict[int, bytes]:
        self.lac_seen.setdefault(address, -1)
        return self.stored.setdefault(address, {})

    def append(self) -> None:
        if not self.writer.fenced and self.writer.next_entry_id < 12:
            entry_id = self.writer.next_entry_id
            self.in_flight.extend((entry_id, member) for member in self.writer.add(entry_id))

    def deliver(self, count: int) -> None:
        for _ in range(min(count, len(self.in_flight))):
            index = self.data.draw(st.integers(0, len(self.in_flight) - 1))
            entry_id, member = self.in_flight.pop(index)
            if member.address in self.fenced:
                self.writer.record_failure(member)
                continue
            self.node(member.address)[entry_id] = encode_entry(1, entry_id, entry_id + 1, b"e")
            lac = max(self.lac_seen[member.address], self.writer.last_add_confirmed)
            self.lac_seen[member.address] = lac
            self.writer.record_ack(entry_id, member)

    def change_ensemble(self) -> None:
        """A member is slow: the writer replaces it (its messages may still land)."""
        if self.writer.fenced:
            return
        old = self.data.draw(st.sampled_from(self.writer.ensemble.members))
        self.fresh += 1
        change = self.writer.change_ensemble({old: m(self.fresh)})
        for new, entry_ids in change.resend.items():
            self.in_flight.extend((entry_id, new) for entry_id in entry_ids)
        self.unwritten = change.ensemble

    def land_change(self) -> None:
        """The writer's compare-and-set: it fails once a recovery marked the record."""
        ensemble, self.unwritten = self.unwritten, None
        if ensemble is None or self.writer.fenced:
            return
        if self.in_recovery:
            self.writer.fence()  # R11
            return
        self.ensembles = [e for e in self.ensembles if e.first_entry_id < ensemble.first_entry_id]
        self.ensembles.append(ensemble)
        self.writer.ensemble_durable(ensemble)

    def covering(self, entry_id: int) -> Ensemble:
        return [e for e in self.ensembles if e.first_entry_id <= entry_id][-1]

    def recover(self) -> int:
        """R16..R21: returns the recovered last entry id."""
        self.in_recovery = True
        last = self.ensembles[-1]
        coverage = FenceCoverage(last, self.qw, self.qa)
        for member in self.data.draw(st.permutations(last.members)):
            if coverage.covered:
                break
            self.node(member.address)
            self.fenced.add(member.address)
            coverage.record_fenced(member.address)
            self.interleave()
        assert coverage.covered
        next_entry = recovery_start([self.lac_seen[a] for a in coverage.fenced], last)
        while True:
            members = write_set(next_entry, last.members, self.qw)
            vote = EntryRecoveryVote(1, next_entry, members, self.qa)
            for member in self.data.draw(st.permutations(members)):
                self.fenced.add(member.address)  # R19: every recovery read fences
                held = self.node(member.address).get(next_entry)
                if held is None:
                    vote.record_no_such_entry(member.address, member.instance_id)
                else:
                    vote.record_entry(member.address, member.instance_id, held)
                self.interleave()
                if vote.outcome in (VoteOutcome.PRESENT, VoteOutcome.ABSENT):
                    break
            if vote.outcome is not VoteOutcome.PRESENT:
                return next_entry - 1
            next_entry += 1

    def interleave(self) -> None:
        step = self.data.draw(st.sampled_from(["deliver", "deliver", "append", "land", "none"]))
        if step == "deliver":
            self.deliver(self.data.draw(st.integers(1, 3)))
        elif step == "append":
            self.append()
        elif step == "land":
            self.land_change()


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_recovery_racing_an_ensemble_change_keeps_every_acknowledged_entry(
    data: st.DataObject,
) -> None:
    e = data.draw(st.integers(1, 5))
    qw = data.draw(st.integers(1, e))
    qa = data.draw(st.integers(1, qw))
    cluster = Cluster(e, qw, qa, data)
    for _ in range(data.draw(st.integers(0, 30))):
        step = data.draw(st.sampled_from(["append", "deliver", "deliver", "change", "land"]))
        if step == "append":
            cluster.append()
        elif step == "deliver":
            cluster.deliver(data.draw(st.integers(1, 4)))
        elif step == "change":
            cluster.change_ensemble()
        else:
            cluster.land_change()
    recovered_last = cluster.recover()
    # the old writer goes on: its change cannot land, fenced nodes refuse its entries
    cluster.land_change()
    cluster.deliver(len(cluster.in_flight))
    assert cluster.writer.last_add_confirmed <= recovered_last
    for entry_id in range(recovered_last + 1):
        holders = write_set(entry_id, cluster.covering(entry_id).members, qw)
        assert any(entry_id in cluster.node(h.address) for h in holders), entry_id
