"""The deterministic simulation of a stream deleted while its writer appends
(tests/simulation/stream_delete.py): the deleting client cut off from some nodes
(one-sided) and a node crashed for some seeds, the delete retried until it returns;
then no append started after it is acknowledged, and every appending task ends.

A failing run names its seed; `PORA_SIM_SEED=<seed> pytest
tests/test_stream_delete_simulation.py -k replay` runs that seed again."""

from __future__ import annotations

import os

import pytest
from simulation.stream_delete import DeletePlan, delete_plan_from_seed, run_delete_plan


def test_a_delete_cut_off_from_two_members_fails_until_the_links_mend() -> None:
    """Three of five nodes cut off from the deleter: some ensemble of three has two
    members it cannot fence, so the first delete fails; the retry after the links
    mend returns."""
    run = run_delete_plan(DeletePlan(seed=1, cut=(0, 1, 2), cut_for_s=3.0))
    assert run.failed_deletes >= 1
    assert all(ending.endswith("NoSuchStream") for ending in run.endings), run.endings


def test_a_delete_cut_off_from_every_member_fails_and_the_writer_goes_on_until_the_retry() -> None:
    """One segment, every node cut off from the deleter: the fence reaches nobody, so
    the writer is acknowledged while the delete fails; the retry stops it."""
    plan = DeletePlan(seed=4, cut=(0, 1, 2, 3, 4), cut_for_s=3.0, rolls=False)
    run = run_delete_plan(plan)
    assert run.failed_deletes >= 1 and run.first_failure is not None
    assert any(start > run.first_failure for start, _ in run.acks)  # acknowledged meanwhile
    assert all(ending.endswith("NoSuchStream") for ending in run.endings), run.endings


def test_a_delete_reaching_every_node_returns_at_once() -> None:
    run = run_delete_plan(DeletePlan(seed=2))
    assert run.failed_deletes == 0
    assert run.acks, "the writer appended before the delete"


@pytest.mark.parametrize("seed", range(3000, 3010))
def test_random_seeds(seed: int) -> None:
    run_delete_plan(delete_plan_from_seed(seed))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3100, 3200))
def test_many_random_seeds(seed: int) -> None:
    run_delete_plan(delete_plan_from_seed(seed))


def test_replay_a_seed_exactly() -> None:
    """PORA_SIM_SEED (default: a fixed one) runs twice with the same steps."""
    plan = delete_plan_from_seed(int(os.environ.get("PORA_SIM_SEED", "3004")))
    first, second = run_delete_plan(plan), run_delete_plan(plan)
    assert first.steps == second.steps
    assert first.acks == second.acks
