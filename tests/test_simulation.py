"""The deterministic simulation of replication (tests/simulation/): writers,
recoveries and readers racing through the real client, wire and server over a
seeded network that delays, drops (resetting connections) and partitions, with
nodes crashing (losing what they had not synced, or left with a torn tail),
slowing, falling behind the writer, pausing, losing their data dir, and meeting a
full or failing disk, and recoveries killed part way; the invariants of
docs/replication.md checked after every step and at the end. The fast suite runs
eight random seeds, the slow one 200.

A failing run names its seed; `PORA_SIM_SEED=<seed> pytest tests/test_simulation.py
-k replay` runs that seed again, exactly (and checks that it does)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, currently_in_test_context, given, note, settings
from hypothesis import strategies as st
from simulation.plans import WRITER, Fault, Plan, plan_from_seed
from simulation.scenarios import RunResult, run_plan
from simulation.scratch import scratch_folder

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)


def run(plan: Plan) -> RunResult:
    if currently_in_test_context():
        note(f"seed {plan.seed}: {plan}")
    with scratch_folder("pora-sim-") as folder:  # in memory: simulation/scratch.py
        return run_plan(plan, Path(folder))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEEDS)
def test_random_runs_keep_the_invariants(seed: int) -> None:
    run(plan_from_seed(seed))


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SEEDS)
def test_many_random_runs_keep_the_invariants(seed: int) -> None:
    run(plan_from_seed(seed))


def test_replay_a_seed_exactly() -> None:
    """PORA_SIM_SEED (default: a fixed one) runs twice with the same event log."""
    seed = int(os.environ.get("PORA_SIM_SEED", "20260421"))
    first = run(plan_from_seed(seed))
    second = run(plan_from_seed(seed))
    assert first.history.log == second.history.log
    assert first.closed == second.closed


@pytest.mark.parametrize(
    ("seed", "recovery_after_s"),
    [
        pytest.param(1000, 0.0, id="before", marks=pytest.mark.slow),
        pytest.param(1001, 0.004, id="during"),
        pytest.param(1002, 0.012, id="after", marks=pytest.mark.slow),
    ],
)
def test_a_recovery_racing_an_ensemble_change(seed: int, recovery_after_s: float) -> None:
    """A member of the writer's ensemble crashes; the writer sees its connection
    lost and replaces it (R9) while recoveries start just before, during and after
    the change's compare-and-set (the analysis of BookKeeper's protocol found
    acknowledged entries lost here). The fast suite runs the race "during"."""
    crash_at = 0.05
    result = run(
        Plan(
            seed=seed,
            nodes=4,
            appenders=6,
            appends_each=12,
            faults=(Fault(crash_at, "crash", 0, for_s=2.0),),
            recoveries=(crash_at + recovery_after_s, crash_at + recovery_after_s + 0.01),
        )
    )
    assert result.history.acked, "the writer acknowledged nothing: no race was run"


def test_a_recovery_reading_an_entry_never_acknowledged() -> None:
    """Two of the three members stop answering the writer: its next entries reach one
    node only and are never acknowledged. The recovery finds them there (present
    wins, R19), re-adds them to the whole write set (R20) and closes after them:
    allowed, an unacknowledged entry is unknown, not absent."""
    result = run(
        Plan(
            seed=7,
            nodes=3,
            ensemble=3,
            write_quorum=3,
            ack_quorum=2,
            appenders=4,
            appends_each=10,
            append_pause_s=0.02,
            faults=(
                Fault(0.1, "partition", 1, for_s=5.0),
                Fault(0.1, "partition", 2, for_s=5.0),
            ),
            recoveries=(1.0,),
            strict_recovery_copies=True,
        )
    )
    history = result.history
    last_acked = max(entry_id for (_, entry_id) in history.acked)
    assert result.closed[0] > last_acked, "no unacknowledged entry was recovered"
    recovered_beyond_ack = [
        entry_id for (_, entry_id) in history.recovery_adds if entry_id > last_acked
    ]
    assert recovered_beyond_ack


@pytest.mark.parametrize("nodes", [3, 4], ids=["no-spare-node", "a-spare-node"])
def test_a_zombie_writer_is_fenced_and_never_acknowledged(nodes: int) -> None:
    """The writer stops (SIGSTOP: its messages held) while appends are in flight; a
    recovery closes the ledger; the writer comes back (SIGCONT): its appends fail
    with LedgerFenced and none is acknowledged after the fence. With no spare node
    its members' timeouts leave it waiting for a replacement that cannot come: the
    record, closed by the recovery, fences it all the same (not NotEnoughNodes)."""
    result = run(
        Plan(
            seed=11,
            nodes=nodes,
            appenders=6,
            appends_each=20,
            append_pause_s=0.02,
            faults=(Fault(0.1, "pause", 0, for_s=1.5, client=WRITER),),
            recoveries=(0.2,),
        )
    )
    history = result.history
    assert WRITER in history.fenced_at, f"the writer was not fenced: {history.failures}"
    assert "NotEnoughNodes" not in history.failures
    lac_at_fence, _ = history.fenced_at[WRITER]
    assert lac_at_fence <= result.closed[0]


@pytest.mark.parametrize("seed", [2, 21, 22])
def test_racing_recoveries_each_see_the_one_close(seed: int) -> None:
    """Recoveries started together race each other (R22): one closes the ledger,
    the others return that close, none fails because the winner sealed the nodes
    under it."""
    result = run(
        Plan(
            seed=seed,
            nodes=3,
            ensemble=2,
            write_quorum=1,
            ack_quorum=1,
            appenders=6,
            appends_each=7,
            recoveries=(0.1574, 0.1575, 0.2892),
            faults=(Fault(0.0755, "slow", 0, for_s=0.626, factor=100.0),),
            close_writer=False,
        )
    )
    assert "RecoveryFailed" not in result.history.failures, result.history.log[-30:]


def put_back_plan(seed: int, *faults: Fault, recovery_at_s: float) -> Plan:
    """E=3 Qw=3 Qa=2 on three nodes, four appenders writing 30 entries each in quick
    succession, one recovery, no reader: the setting of the put-back scenarios."""
    return Plan(
        seed=seed,
        nodes=3,
        ensemble=3,
        write_quorum=3,
        ack_quorum=2,
        appenders=4,
        appends_each=30,
        append_pause_s=0.01,
        readers=0,
        tail=False,
        faults=faults,
        recoveries=(recovery_at_s,),
        close_writer=False,
    )


def test_a_node_put_back_from_an_old_copy_counts_as_a_new_instance() -> None:
    """Issue 26's scenario in simulated time (R27): E=3 Qw=3 Qa=2 on three nodes;
    node 1's data dir copied as the writes begin; node 2 cut off from the writer, so
    the later entries are acknowledged by nodes 0 and 1 alone; node 1 put back from
    the copy; a recovery that cannot reach node 0 must not take node 1's "no such
    entry" for its old instance's: it fails, and the auditor's recovery, with every
    node back, closes the ledger with every acknowledged entry (the invariants)."""
    result = run(
        put_back_plan(
            26,
            Fault(0.0, "rollback", 1, for_s=0.4),
            Fault(0.05, "partition", 2, for_s=5.0),
            Fault(0.45, "partition", 0, for_s=5.0, client="recovery-0"),
            recovery_at_s=0.5,
        )
    )
    history = result.history
    acked_after_cut = [entry_id for (_, entry_id) in history.acked if entry_id > 10]
    assert acked_after_cut, "no entry was acknowledged by nodes 0 and 1 alone"
    assert any("undo roll_back 10.0.0.2:3181" in line for line in history.log)
    assert not [line for line in history.log if "recovery-0 sees" in line], (
        "a recovery closed the ledger without node 0"
    )
    assert [line for line in history.log if "recovery-0 failed: RecoveryFailed" in line]


def test_a_fence_survives_a_node_put_back_from_a_copy_taken_before_it() -> None:
    """R27's fence rule in simulated time: E=3 Qw=3 Qa=2 on three nodes; node 1's data
    dir copied before any fence; the writer paused (SIGSTOP) with appends in flight;
    a recovery that cannot reach node 2 fences nodes 0 and 1 (no fenced member to
    spare) and closes the ledger; node 1 killed before any renewal raised its mark
    and put back from the copy, which lacks the fence. The fence's mark write put
    the copy behind the mark: node 1 is a new instance, so neither the resumed
    writer (whose adds nodes 1 and 2 would otherwise both take) nor anyone reading
    the recovery's copies counts on what the old instance held (the invariants;
    without the rule, node 1 comes back as itself, without the fence and without
    the entries the recovery copied to it, R20)."""
    result = run(
        put_back_plan(
            2736,
            Fault(0.0, "rollback-killed", 1, for_s=0.6),
            Fault(0.0, "partition", 2, for_s=5.0, client="recovery-0"),
            Fault(0.1, "pause", 0, for_s=1.5, client=WRITER),
            recovery_at_s=0.2,
        )
    )
    history = result.history
    assert any("undo _roll_back_killed 10.0.0.2:3181" in line for line in history.log)
    assert [line for line in history.log if "recovery-0 sees" in line], history.log[-30:]


@pytest.mark.parametrize(
    "seed", [32, pytest.param(35, marks=pytest.mark.slow), pytest.param(36, marks=pytest.mark.slow)]
)
def test_a_recovery_killed_after_it_replaced_a_member(seed: int) -> None:
    """E = Qw = Qa = 3 on four nodes: recovery-0's adds to one member fail, so its
    re-adds fall short and it replaces that member by the spare (R20); it is
    killed right after it wrote that ensemble to the record, before closing. The
    auditor's recovery then meets a record whose last ensemble names a member holding
    only what recovery-0 gave it: it must still find every acknowledged entry, and
    re-add to the replacement every entry from the ensemble's first on (R18), so that
    each has Qa copies on the write set the record names. Forty appenders leave more
    acknowledged entries past the nodes' LAC than recovery-0 re-adds before it dies."""
    result = run(
        Plan(
            seed=seed,
            nodes=4,
            ensemble=3,
            write_quorum=3,
            ack_quorum=3,
            appenders=40,
            appends_each=12,
            append_pause_s=0.005,
            faults=(Fault(0.05, "kill-recovery", seed, for_s=5.0, client="recovery-0"),),
            recoveries=(0.06,),
            close_writer=False,
        )
    )
    history = result.history
    assert any("recovery-0 killed right after" in line for line in history.log), history.log[-30:]
    assert history.acked, "the writer acknowledged nothing"


def test_the_planner_draws_a_recovery_killed_after_it_replaced_a_member() -> None:
    """Seeded runs meet the fault by themselves: some plans kill recovery-0 after it
    replaced a member, each with recovery-0 planned and a spare node to replace by."""
    plans = [plan_from_seed(seed) for seed in range(200)]
    killing = [p for p in plans if any(f.kind == "kill-recovery" for f in p.faults)]
    assert len(killing) >= 10
    for plan in killing:
        spares = plan.write_quorum - plan.ack_quorum + 1
        assert plan.recoveries and plan.nodes >= plan.ensemble + spares
        assert all(f.client == "recovery-0" for f in plan.faults if f.kind == "kill-recovery")


@pytest.mark.parametrize("kill_after_s", [0.0005, 0.002, 0.006, 0.02])
def test_a_recovery_killed_wherever_it_is(kill_after_s: float) -> None:
    """recovery-0 starts while twenty appenders write and is killed that long after,
    as a SIGKILLed process (from before its first request to mid re-add, by the
    delay); recovery-1 starts later: its close holds every acknowledged entry, and
    the auditor's recovery sees the same close."""
    result = run(
        Plan(
            seed=40,
            nodes=4,
            appenders=20,
            appends_each=8,
            append_pause_s=0.005,
            recoveries=(0.05, 0.08),
            faults=(Fault(0.05 + kill_after_s, "kill", 0, client="recovery-0"),),
        )
    )
    history = result.history
    killed = [line for line in history.log if "recovery-0 killed before it returned" in line]
    assert killed, history.log[-30:]
    assert history.acked, "the writer acknowledged nothing"


def test_the_planner_draws_kills_of_a_recovery_by_itself() -> None:
    plans = [plan_from_seed(seed) for seed in range(200)]
    kills = [f for p in plans for f in p.faults if f.kind == "kill"]
    assert len(kills) >= 20
    for plan in plans:
        for fault in plan.faults:
            if fault.kind == "kill":
                k = int(fault.client.removeprefix("recovery-"))
                assert plan.recoveries[k] <= fault.at_s


@pytest.mark.parametrize(
    ("seed", "delete_at_s", "recoveries"),
    [(31, 0.15, ()), (32, 0.02, ()), (33, 0.15, (0.149,))],
    ids=["mid-write", "early", "racing-a-recovery"],
)
def test_a_delete_racing_a_writer(
    seed: int, delete_at_s: float, recoveries: tuple[float, ...]
) -> None:
    """R26: the ledger is deleted while its writer appends from many tasks (a tail
    and a reader follow it, a recovery may race the delete): no acknowledgement after
    the delete returned, every append failing after it fails with LedgerDeleted, and
    the auditor finds the ledger gone."""
    result = run(
        Plan(
            seed=seed,
            nodes=4,
            appenders=6,
            appends_each=30,
            append_pause_s=0.02,
            recoveries=recoveries,
            delete_at_s=delete_at_s,
            readers=1,
            tail=True,
        )
    )
    history = result.history
    assert history.deleted_ledgers == {result.ledger_id}, history.failures
    if not recoveries:
        assert history.writer_first_failure is not None
        assert history.writer_first_failure[1] == "LedgerDeleted", history.failures


def test_a_delete_that_cannot_reach_a_member_fences_or_fails() -> None:
    """R26 with Qa = 1 and a member the delete cannot reach but the writer can: the
    fence cannot cover that member's write sets, so the delete fails (DeleteFailed)
    rather than leave a writer acknowledged there after it returned; the record
    stays marked and the auditor's recovery closes it with every acknowledged entry."""
    result = run(
        Plan(
            seed=34,
            nodes=2,
            ensemble=2,
            write_quorum=2,
            ack_quorum=1,
            appenders=4,
            appends_each=40,
            append_pause_s=0.02,
            recoveries=(),
            delete_at_s=0.15,
            faults=(Fault(0.1, "partition", 0, for_s=5.0, client="deleter"),),
            readers=0,
            tail=False,
        )
    )
    history = result.history
    assert history.deleted_ledgers == set()
    assert history.failures.get("DeleteFailed") == 1, history.failures
    assert history.acked and WRITER in history.fenced_at


def test_the_planner_draws_deletes_by_itself() -> None:
    drawn = [plan_from_seed(seed).delete_at_s for seed in range(40)]
    assert any(at is not None for at in drawn) and any(at is None for at in drawn)


def test_a_member_left_behind_is_replaced_and_the_writer_goes_on() -> None:
    """One member of the writer's ensemble answers 50 times slower than the others,
    still within node_timeout_s, for two seconds: the writer's backlog for it passes
    node_backlog_bytes_max (small in SIM_CONFIG) and the member is failed and replaced
    (R8, R9), with every append acknowledged and the backlog invariant checked at
    each batch queued."""
    result = run(
        Plan(
            seed=31,
            nodes=4,
            appenders=8,
            appends_each=30,
            append_pause_s=0.01,
            recoveries=(),
            faults=(Fault(0.05, "lag", 0, for_s=2.0, factor=50.0),),
        )
    )
    history = result.history
    assert not history.failures, history.failures
    assert len(history.acked) == 8 * 30
    first, last = result.ensembles[0], result.ensembles[-1]
    assert first.members[0] not in last.members, [e.members for e in result.ensembles]


def test_the_simulation_refuses_a_trio_it_was_not_checked_against() -> None:
    from simulation.clock import _check_trio_version  # noqa: PLC0415

    _check_trio_version("0.35.0")
    with pytest.raises(RuntimeError, match=r"supports trio >=0\.25,<0\.36; this is trio 0\.40\.1"):
        _check_trio_version("0.40.1")


def test_crashes_under_load_lose_what_was_not_synced_and_nothing_acknowledged() -> None:
    """Three members crash one after another while eight appenders keep the journal
    busy: each crash finds group commits written and not yet synced (a seeded disk
    latency), which its disk loses, reverted or as a torn tail (tests/simulation/
    disk.py). Every acknowledged entry is read back (the invariants)."""
    result = run(
        Plan(
            seed=0,
            nodes=4,
            appenders=8,
            appends_each=15,
            append_pause_s=0.005,
            recoveries=(),
            faults=(
                Fault(0.03, "crash", 0, for_s=0.1),
                Fault(0.06, "crash", 1, for_s=0.1),
                Fault(0.09, "crash", 2, for_s=0.1),
            ),
        )
    )
    assert result.lost_writes > 0, "no crash caught an unsynced write"
    assert result.torn_tails > 0, "no crash left a torn tail"
    assert len(result.history.acked) == 8 * 15


@pytest.mark.parametrize(
    ("kind", "calls"),
    [("disk-error", ("sync",)), ("disk-full", ("write",)), ("disk-error", ("write", "sync"))],
)
def test_a_full_or_failing_disk_under_a_member(kind: str, calls: tuple[str, ...]) -> None:
    """One member's disk fails its writes or syncs for a while (ENOSPC, EIO): its
    journal stops and it refuses every add (docs/operations.md) until the disk is
    mended and the node restarted; nothing acknowledged is lost (the invariants)."""
    result = run(
        Plan(
            seed=5,
            nodes=4,
            ensemble=4,  # every node a member (entries striped: Qw < E)
            write_quorum=3,
            ack_quorum=2,
            appenders=6,
            appends_each=10,
            append_pause_s=0.01,
            faults=(Fault(0.05, kind, 0, for_s=0.3, calls=calls),),
        )
    )
    assert result.disk_faults_met > 0, "the member's disk never failed a call"
    assert result.history.acked
