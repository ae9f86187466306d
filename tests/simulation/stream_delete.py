"""Simulated deletes of a stream while its live writer appends (docs/streams.md,
"Deleting a stream"), on the stream scenarios' simulated cluster, network and time:
the writer appends from several tasks, across rollovers (64 KiB segments, 8 KiB
payloads) for half the seeds, to one segment for the others; at a drawn time a
deleting client, cut off (one-sided) from some nodes while the writer reaches them
all, and with a node crashed for some seeds, deletes the stream, and retries after
each failure until the links mend. Checked: a delete
that returns left no append started after it acknowledged (whatever failed before
it); a failed one left the stream gone for every client; every appending task ends
once a delete returned."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import trio

from journal.errors import PoraError
from pora.meta.store import MetadataStore
from pora.streams.errors import NoSuchStream
from pora.streams.writer import StreamWriter
from simulation import scenarios
from simulation.cluster import SimCluster
from simulation.network import SimNetwork
from simulation.scratch import scratch_folder
from simulation.stream_scenarios import (
    SEGMENT_BYTES,
    STREAM,
    payload_for,
    serial_store,
    sim_client,
)

#: a segment no run fills: the writer never rolls, so no rollover's compare-and-set
#: finds the stream gone before the delete's fence does
ONE_SEGMENT_BYTES = 256 << 20
#: a retried delete waits this long (simulated) after a failure
RETRY_S = 0.2
#: every appending task ends within this (simulated) after the delete returned
ENDS_WITHIN_S = 30.0


@dataclass(frozen=True)
class DeletePlan:
    seed: int
    nodes: int = 5
    appenders: int = 3
    #: when the delete starts (simulated s after the writer opened)
    delete_at_s: float = 0.2
    #: the nodes (indexes) the deleter cannot reach, and for how long from the delete
    cut: tuple[int, ...] = ()
    cut_for_s: float = 1.0
    #: a node (index) crashed at the delete's start for `crash_for_s`, or None
    crash: int | None = None
    crash_for_s: float = 0.5
    #: whether segments roll (every eight appends or so) or one segment holds the run
    rolls: bool = True


def delete_plan_from_seed(seed: int) -> DeletePlan:
    rng = random.Random(f"{seed}/delete-plan")
    nodes = 5
    return DeletePlan(
        seed=seed,
        nodes=nodes,
        appenders=rng.randint(1, 4),
        delete_at_s=round(rng.uniform(0.05, 0.5), 4),
        cut=tuple(sorted(rng.sample(range(nodes), rng.randint(0, 4)))),
        cut_for_s=round(rng.uniform(0.1, 3.0), 3),
        crash=rng.randrange(nodes) if rng.random() < 0.3 else None,
        crash_for_s=round(rng.uniform(0.1, 1.0), 3),
        rolls=rng.random() < 0.5,
    )


@dataclass
class DeleteRun:
    """What happened, in steps (each event gets the next number)."""

    plan: DeletePlan
    steps: list[str] = field(default_factory=list)
    #: (start step, position) of each acknowledged append
    acks: list[tuple[int, str]] = field(default_factory=list)
    failed_deletes: int = 0
    #: the step at which the first delete failed
    first_failure: int | None = None
    #: the step at which the delete returned
    returned: int | None = None
    endings: list[str] = field(default_factory=list)

    def note(self, text: str) -> int:
        self.steps.append(text)
        return len(self.steps) - 1

    def fail(self, what: str) -> None:
        tail = "\n".join(f"  {k}: {s}" for k, s in enumerate(self.steps[-40:]))
        raise AssertionError(f"seed {self.plan.seed}: {what}\n{self.plan}\n{tail}")

    def check(self) -> None:
        returned = self.returned
        if returned is None:
            self.fail("the delete never returned")
            return
        late = [(start, position) for start, position in self.acks if start > returned]
        if late:
            self.fail(f"appends started after the delete returned were acknowledged: {late}")
        if len(self.endings) != self.plan.appenders:
            self.fail(f"only {len(self.endings)} of {self.plan.appenders} appenders ended")


def run_delete_plan(plan: DeletePlan, folder: Path | None = None) -> DeleteRun:
    if folder is None:
        with scratch_folder("pora-stream-delete-sim-") as temporary:
            return run_delete_plan(plan, Path(temporary))

    async def body(store: MetadataStore, cluster: SimCluster) -> DeleteRun:
        return await _run(plan, store, cluster)

    run = scenarios.run_simulated(plan.seed, plan.nodes, folder, body, serial_store)
    run.check()
    return run


async def _run(plan: DeletePlan, store: MetadataStore, cluster: SimCluster) -> DeleteRun:
    run = DeleteRun(plan)
    network = SimNetwork(cluster, plan.seed)
    async with sim_client(store, network, "creator") as client:
        segment_bytes = SEGMENT_BYTES if plan.rolls else ONE_SEGMENT_BYTES
        await client.create_stream(STREAM, segment_bytes_max=segment_bytes)
    async with (
        sim_client(store, network, "writer") as writing,
        trio.open_nursery() as nursery,
    ):
        stream = await writing.open_stream(STREAM)
        async with stream.open_writer() as writer:
            run.note(f"writer open at epoch {writer.epoch}")
            async with trio.open_nursery() as appenders:
                for k in range(plan.appenders):
                    appenders.start_soon(_appender, run, writer, k)
                await trio.sleep(plan.delete_at_s)
                nursery.start_soon(_faults, run, network, cluster)
                await _delete(run, store, network)
                with trio.fail_after(ENDS_WITHIN_S):
                    while len(run.endings) < plan.appenders:  # noqa: ASYNC110 - simulated time
                        await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    return run


async def _appender(run: DeleteRun, writer: StreamWriter, appender: int) -> None:
    k = 0
    while True:
        started = run.note(f"append a{appender}/k{k}")
        try:
            position = await writer.append(payload_for("writer", appender, k))
        except PoraError as error:
            run.endings.append(f"a{appender}: {type(error).__name__}")
            run.note(f"a{appender} ends: {type(error).__name__}: {error}")
            return
        run.acks.append((started, str(position)))
        run.note(f"a{appender}/k{k} acknowledged at {position}")
        k += 1


async def _faults(run: DeleteRun, network: SimNetwork, cluster: SimCluster) -> None:
    plan = run.plan
    addresses = cluster.addresses
    crashed = None if plan.crash is None else addresses[plan.crash % len(addresses)]
    for index in plan.cut:
        network.partition("deleter", addresses[index])
    if crashed is not None:
        run.note(f"crash {crashed}")
        await cluster.crash(crashed)
    run.note(f"deleter cut off from {[addresses[i] for i in plan.cut]}")
    ends = sorted([(plan.cut_for_s, "cut")] + ([(plan.crash_for_s, "crash")] if crashed else []))
    elapsed = 0.0
    for at_s, what in ends:
        await trio.sleep(at_s - elapsed)
        elapsed = at_s
        if what == "cut":
            for index in plan.cut:
                network.heal("deleter", addresses[index])
            run.note("deleter's links mended")
        else:
            assert crashed is not None
            await cluster.restart(crashed)
            run.note(f"restart {crashed}")


async def _delete(run: DeleteRun, store: MetadataStore, network: SimNetwork) -> None:
    async with sim_client(store, network, "deleter") as deleting:
        while True:
            run.note("delete starts")
            try:
                await deleting.delete_stream(STREAM)
            except PoraError as error:
                run.failed_deletes += 1
                failed = run.note(f"delete failed: {type(error).__name__}: {error}")
                if run.first_failure is None:
                    run.first_failure = failed
                try:
                    await deleting.open_stream(STREAM)
                except NoSuchStream:
                    pass
                else:
                    run.fail("a failed delete left the stream open to clients")
                await trio.sleep(RETRY_S)
                continue
            run.returned = run.note("delete returned")
            return
