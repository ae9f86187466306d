"""The deterministic simulation of a stream (tests/simulation/stream_scenarios.py):
a live writer appending from several tasks across rollovers, a second writer taking
over (and for some seeds a third racing it), a subscriber throughout and a reader
midway, with node crashes and partitions
timed to rollovers and to the takeover, and a document compare-and-set whose reply
is lost after it took; transactions from several processes committing (with a key,
an app version, or neither), aborting, dying mid-way (collected at the end) or right
after their commit's compare-and-set took (their batch retried), with crashes and
partitions as they commit; the invariants of tests/simulation/stream_invariants.py
checked after every step and at the end.

A failing run names its seed; `PORA_SIM_SEED=<seed> pytest
tests/test_stream_simulation.py -k replay` runs that seed again."""

from __future__ import annotations

import os

import pytest
from simulation.plans import Fault
from simulation.stream_scenarios import (
    StreamFault,
    StreamPlan,
    run_stream_plan,
    stream_plan_from_seed,
)
from simulation.stream_txn import TxnPlan


def test_a_writer_rolls_over_and_a_takeover_fences_it() -> None:
    result = run_stream_plan(StreamPlan(seed=1, appenders=3, appends_each=12, takeover_at_s=0.1))
    assert result.fenced
    assert result.segments >= 3  # rolled at least once, then taken over
    assert len(result.history.acked) > 10
    assert set(result.history.acked) <= set(result.final)


@pytest.mark.slow  # some 4 s; random seed 1002 of the fast suite races too
def test_two_writers_race_to_take_over_while_the_first_appends() -> None:
    for racer_at_s in (0.1, 0.1005, 0.103):
        plan = StreamPlan(seed=5, appends_each=12, takeover_at_s=0.1, racer_at_s=racer_at_s)
        result = run_stream_plan(plan)
        assert result.fenced  # writer-1, and one racer by the other
        # both racers' epoch compare-and-sets took (writer-1 holds 1); the first may
        # be fenced by the second while it still recovers, before it could append
        epochs = [epoch for _, _, _, epoch in result.history.takeovers]
        assert max(epochs) >= 3 and len(set(epochs)) == len(epochs)
        assert set(result.history.acked) <= set(result.final)


def test_a_lost_reply_after_the_compare_and_set_took_adds_no_segment_twice() -> None:
    for commit in (1, 2, 3, 4):
        plan = StreamPlan(seed=2, appends_each=10, lose_reply_of_commit=commit)
        result = run_stream_plan(plan)
        assert result.lost_replies == 1
        ledgers = [ledger for ledger, _ in result.history.segments.values()]
        assert len(ledgers) == len(set(ledgers)), f"commit {commit}: a ledger in two segments"


def test_crashes_at_a_rollover_and_during_the_takeover() -> None:
    crash = Fault(at_s=0.0, kind="crash", node=0, for_s=0.3)
    partition = Fault(at_s=0.0, kind="partition", node=1, for_s=0.3, client="writer-2")
    plan = StreamPlan(
        seed=3,
        appends_each=20,  # writer-1 still appends when writer-2 takes over
        faults=(
            StreamFault(crash, after_commit=3),
            StreamFault(replace_node(crash, 2), at_takeover=True),
            StreamFault(partition, at_takeover=True),
        ),
    )
    result = run_stream_plan(plan)
    assert result.fenced
    assert result.history.acked


def test_transactions_commit_abort_die_and_retry_around_the_live_writers() -> None:
    partition = Fault(at_s=0.0, kind="partition", node=1, for_s=0.3, client="txn-4")
    crash = Fault(at_s=0.0, kind="crash", node=2, for_s=0.2, client="txn-4")
    plan = StreamPlan(
        seed=4,
        appends_each=6,
        transactions=(
            TxnPlan("txn-1", 0.01, "key:k1", segments=2),
            TxnPlan("txn-2", 0.02, "key:k1", end="crash-after-cas"),  # races txn-1's key
            TxnPlan("txn-3", 0.03, "version:2", end="crash-after-cas", segments=2),
            TxnPlan("txn-4", 0.04, "version:1", faults=(partition, crash)),  # below 2
            TxnPlan("txn-5", 0.05, "-", end="lose-reply", segments=2),
            TxnPlan("txn-6", 0.06, "key:k2", end="abort", segments=2),
            TxnPlan("txn-7", 0.07, "key:k3", end="crash", segments=2),
        ),
    )
    result = run_stream_plan(plan)
    attempts = result.history.attempts
    # txn-1 and txn-2 race with k1: whichever comes second is skipped (the invariants
    # check that no reader gets entries of both)
    assert attempts["txn-1.1"].outcome in ("committed", "skipped")
    assert attempts["txn-2.1"].outcome is None  # died once its compare-and-set took
    assert attempts["txn-2.2"].outcome == "skipped"  # its retry: k1 was recorded
    assert attempts["txn-3.2"].outcome == "skipped"
    assert attempts["txn-5.1"].outcome == "committed"  # a keyless commit's lost reply
    assert attempts["txn-6.1"].outcome == "aborted"
    assert attempts["txn-7.1"].outcome == "collected"
    assert attempts["txn-4.1"].outcome in ("skipped", "committed", None)


def replace_node(fault: Fault, node: int) -> Fault:
    return Fault(fault.at_s, fault.kind, node, fault.for_s, fault.client, fault.factor)


#: seeds whose plans are worth keeping as they are
NAMED_SEEDS = [
    0,  # a node crashes right after the document's 4th commit (a rollover's)
    1,  # a crash at the takeover's start; commit 6's reply is lost after it took
    80,  # a crash and a partition of writer-2 as its takeover starts
]


@pytest.mark.parametrize("seed", NAMED_SEEDS)
def test_named_seeds(seed: int) -> None:
    run_stream_plan(stream_plan_from_seed(seed))


# a few seeds in the fast suite (about 1 s each); the slow run below draws 300
@pytest.mark.parametrize("seed", range(1000, 1012))
def test_random_seeds(seed: int) -> None:
    run_stream_plan(stream_plan_from_seed(seed))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2000, 2300))
def test_many_random_seeds(seed: int) -> None:
    run_stream_plan(stream_plan_from_seed(seed))


def test_replay_a_seed() -> None:
    """PORA_SIM_SEED (default: a fixed one) runs again: the same plan each time, and
    the invariants hold on each run. The event log replays exactly on an idle machine
    only: under load a subscriber may wake a fraction of a simulated millisecond
    apart (a source of real time not yet found), so the logs are not compared."""
    seed = int(os.environ.get("PORA_SIM_SEED", "20261126"))
    assert stream_plan_from_seed(seed) == stream_plan_from_seed(seed)
    for _ in range(2):
        run_stream_plan(stream_plan_from_seed(seed))
