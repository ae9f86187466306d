"""The plans of the simulated runs (scenarios.py): the faults a run meets and when,
and `plan_from_seed`, which draws a whole plan from one seed."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

WRITER = "writer"


@dataclass(frozen=True)
class Fault:
    """At `at_s`, `kind` hits node `node` (an index into the addresses) for `for_s`:
    crash (restarted after, same data dir), partition (from `client`), slow (its
    messages take `factor` times longer), lag (as slow, but `node` indexes the
    writer's ensemble of that moment: a member left behind by the others, answering
    within `node_timeout_s`, until the backlog bound fails it), wipe (back at once
    on an empty data dir), pause (`client`'s messages are held, as a process stopped
    by SIGSTOP), rollback (its data dir copied now, and put back from that copy after
    `for_s`: R27), rollback-killed (as rollback, but the node is killed within its
    last mark interval: its mark is what its start and its fences wrote; planned
    scenarios only, since entries it acknowledged since the copy are at risk).

    disk-full, disk-error: the node's disk fails `calls` with ENOSPC, EIO for
    `for_s`; then it is mended, and the node restarted if its journal failed.

    kill-recovery: the adds of the recovery `client` to Qw - Qa + 1 members of the
    ledger's last ensemble, from member `node` on (an index into its members), fail
    for `for_s` (fencing and reads pass), so its re-adds fall short of Qa and it
    replaces them (R20); it is killed right after it wrote the record naming the
    replacements, before it closes, and a later recovery (another planned one, or the
    auditor's) must find every acknowledged entry all the same.

    kill: the recovery `client` is killed at `at_s` wherever it is (fencing, voting,
    re-adding, writing the record), as a SIGKILLed process: what it sent is still
    delivered, it learns nothing more; a later recovery must find every acknowledged
    entry all the same."""

    at_s: float
    kind: str
    node: int
    for_s: float = 0.5
    client: str = WRITER
    factor: float = 100.0
    #: disk-full, disk-error: which of the node's file calls fail ("write", "sync")
    calls: tuple[str, ...] = ("write",)


@dataclass(frozen=True)
class Plan:
    seed: int
    nodes: int = 4
    ensemble: int = 3
    write_quorum: int = 3
    ack_quorum: int = 2
    appenders: int = 6
    appends_each: int = 5
    #: start times of recoveries racing the writer (and each other)
    recoveries: tuple[float, ...] = (0.05,)
    readers: int = 1
    tail: bool = True
    faults: tuple[Fault, ...] = ()
    drop_rate: float = 0.0
    #: the writer closes its ledger once its appenders are done (if not fenced)
    close_writer: bool = True
    #: every member of a recovered entry's write set holds it, whether or not it
    #: answered the recovery (true only when no fault hides a member from it)
    strict_recovery_copies: bool = False
    #: the writer's pause between two appends of one task, at most (simulated s)
    append_pause_s: float = 0.05
    #: when a delete of the ledger (client "deleter") starts, racing the writer (R26)
    delete_at_s: float | None = None


def plan_from_seed(seed: int) -> Plan:
    """The whole plan drawn from the seed alone, so a seed names a run: quorums (Qw
    from 1 to E, Qa from 1 to Qw), node count, load, racing recoveries, a full or
    failing disk under one node (sometimes), and up to three other faults (at most one wipe or
    rollback, and only with Qa >= 2: a wiped node loses its copies, a rolled-back one
    those it took since the copy, and an entry acknowledged on Qa nodes survives the
    loss of Qa - 1; a kill-recovery plans recovery-0 for it to kill, and a spare node
    for it to replace a member by; a kill stops a planned recovery wherever it is
    (sometimes); a member left behind comes with more appends,
    enough to take it past SIM_CONFIG's backlog bound)."""
    rng = random.Random(seed)
    ensemble = rng.randint(2, 4)
    write_quorum = rng.randint(1, ensemble)
    ack_quorum = rng.randint(1, write_quorum)
    nodes = ensemble + rng.randint(0, 2)
    faults: list[Fault] = []
    wiped = False
    kills = False
    for _ in range(rng.randint(0, 3)):
        kind = rng.choice(
            ["crash", "partition", "slow", "pause", "wipe", "rollback", "kill-recovery", "lag"]
        )
        if kind in ("wipe", "rollback") and (wiped or ack_quorum < 2):
            kind = "crash"
        wiped = wiped or kind in ("wipe", "rollback")
        kills = kills or kind == "kill-recovery"
        client = rng.choice([WRITER, WRITER, "recovery-0", "reader-0"])
        fault = Fault(
            at_s=round(rng.uniform(0.0, 0.3), 4),
            kind=kind,
            node=rng.randrange(nodes),
            for_s=round(rng.uniform(0.05, 1.0), 3),
            client="recovery-0" if kind == "kill-recovery" else client,
            factor=rng.choice([10.0, 100.0, 300.0]),
        )
        if kind == "lag":  # behind for long, each answer within node_timeout_s
            fault = replace(fault, for_s=fault.for_s + 1.0, factor=rng.choice([20.0, 50.0]))
        faults.append(fault)
    if wiped:
        # a recovery re-adds to a wiped (or rolled-back) member's replacement: never
        # the node itself (R9 excludes an address that failed for the ledger)
        nodes = max(nodes, ensemble + 1)
    if kills:
        # a spare for each member whose recovery adds fail
        nodes = max(nodes, ensemble + write_quorum - ack_quorum + 1)
    recoveries = tuple(round(rng.uniform(0.0, 0.4), 4) for _ in range(rng.randint(int(kills), 2)))
    if kills:
        # the adds fail from recovery-0's start at the latest
        faults = [
            replace(f, at_s=min(f.at_s, recoveries[0])) if f.kind == "kill-recovery" else f
            for f in faults
        ]
    # drawn apart from the rest, so that a seed's other choices stay what they were
    deleting = random.Random(f"{seed}/delete")
    delete_at_s = round(deleting.uniform(0.0, 0.4), 4) if deleting.random() < 0.25 else None
    if delete_at_s is not None and deleting.random() < 0.5:
        # a node the writer reaches and the delete does not: only the fence keeps
        # the writer from being acknowledged there after the delete returned
        faults.append(
            Fault(
                at_s=round(max(0.0, delete_at_s - deleting.uniform(0.0, 0.05)), 4),
                kind="partition",
                node=deleting.randrange(nodes),
                for_s=round(deleting.uniform(0.05, 1.0), 3),
                client="deleter",
            )
        )
    # drawn apart from the rest too: a recovery killed at whatever step it is in
    killing = random.Random(f"{seed}/kill")
    if recoveries and killing.random() < 0.25:
        k = killing.randrange(len(recoveries))
        faults.append(
            Fault(
                at_s=round(recoveries[k] + killing.uniform(0.0, 0.05), 4),
                kind="kill",
                node=0,
                client=f"recovery-{k}",
            )
        )
    # drawn apart from the rest too: a full or failing disk under one node
    disks = random.Random(f"{seed}/disk-faults")
    if disks.random() < 0.3:
        faults.append(
            Fault(
                at_s=round(disks.uniform(0.0, 0.3), 4),
                kind=disks.choice(["disk-full", "disk-error"]),
                node=disks.randrange(nodes),
                for_s=round(disks.uniform(0.05, 1.0), 3),
                calls=disks.choice([("write",), ("sync",), ("write", "sync")]),
            )
        )
    lagging = any(fault.kind == "lag" for fault in faults)
    return Plan(
        seed=seed,
        nodes=nodes,
        ensemble=ensemble,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        appenders=rng.randint(1, 8),
        # a member left behind trips the backlog bound only under enough load
        appends_each=rng.randint(3, 8) + (20 if lagging else 0),
        recoveries=recoveries,
        readers=rng.randint(0, 2),
        tail=rng.random() < 0.5,
        faults=tuple(faults),
        drop_rate=rng.choice([0.0, 0.0, 0.005, 0.02]),
        close_writer=rng.random() < 0.7,
        delete_at_s=delete_at_s,
    )
