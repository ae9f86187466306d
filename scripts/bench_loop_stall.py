"""Worst event-loop stall of a served node under a sustained write load.

    .venv/bin/python scripts/bench_loop_stall.py --duration-s 300 [--dir DIR]
        [--node-option NAME=VALUE ...] [-- BENCH_ARGS ...]

Starts `pora serve` in a child process with two probes added to its trio loop, loads
it with `pora bench --connect` (fresh ledgers, `--no-redis --rounds 1`) for the
given duration, stops it with SIGTERM and prints what the probes saw:

- lateness: a task sleeps 1 ms in a loop and records how late each wake-up is; the
  worst lateness is the longest the loop could not run a ready task;
- steps: a trio instrument times every task step and keeps the longest ones with
  the task's name, so a stall can be pinned on the code that held the loop;
- gc: the longest pauses of Python's cyclic garbage collector.

It also samples /proc/meminfo (Dirty, Writeback) once a second, to show whether the
load reached the kernel's dirty-page limits (/proc/sys/vm/dirty_*). The probes are
measurement only and live here, not in the node.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from pora.server.settings import Settings

LATE_BUCKETS_MS = (1, 5, 10, 20, 50, 100, 200, 500)
STEPS_KEPT = 12


class _StepTimer(trio.abc.Instrument):
    """Keeps the longest task steps: wall ms, then where the wall time went by the
    loop thread's /proc schedstat (ms on a core, ms waiting for a core that other
    threads or processes held, ms off both: blocked in a system call), task name."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.sched_started = b""
        self.longest: list[tuple[float, float, float, float, str]] = []
        self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def _sched(self) -> bytes:
        return os.pread(self._schedstat, 96, 0)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.sched_started = self._sched()
        self.started = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.started is None:  # the step that added the instrument
            return
        took = time.perf_counter() - self.started
        if len(self.longest) < STEPS_KEPT or took > self.longest[-1][0]:
            on_core_ns, waited_ns = (
                int(after) - int(before)
                for after, before in zip(
                    self._sched().split()[:2], self.sched_started.split()[:2], strict=True
                )
            )
            on_core, waited = on_core_ns / 1e9, waited_ns / 1e9
            blocked = max(took - on_core - waited, 0.0)
            self.longest.append((took, on_core, waited, blocked, task.name))
            self.longest.sort(reverse=True)
            del self.longest[STEPS_KEPT:]


class _Probe:
    def __init__(self) -> None:
        self.late_max_s = 0.0
        self.late_at_s = 0.0
        self.wakeups = 0
        self.buckets = dict.fromkeys(LATE_BUCKETS_MS, 0)
        self.gc_longest: list[float] = []
        self._gc_started = 0.0
        self.steps = _StepTimer()
        self.started = time.monotonic()

    async def sleep_loop(self) -> None:
        while True:
            before = time.perf_counter()
            await trio.sleep(0.001)
            late = time.perf_counter() - before - 0.001
            self.wakeups += 1
            if late > self.late_max_s:
                self.late_max_s = late
                self.late_at_s = time.monotonic() - self.started
            for bucket in LATE_BUCKETS_MS:
                if late * 1000 >= bucket:
                    self.buckets[bucket] += 1

    def on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_longest.append(time.perf_counter() - self._gc_started)
            self.gc_longest.sort(reverse=True)
            del self.gc_longest[5:]

    def report(self) -> dict[str, Any]:
        return {
            "wakeups": self.wakeups,
            "late_max_ms": round(self.late_max_s * 1000, 2),
            "late_max_at_s": round(self.late_at_s, 1),
            "wakeups_late_ms_at_least": {str(k): v for k, v in self.buckets.items()},
            "longest_steps_ms_wall_oncore_waited_blocked": [
                (*(round(t * 1000, 1) for t in times), name) for *times, name in self.steps.longest
            ],
            "longest_gc_ms": [round(s * 1000, 2) for s in self.gc_longest],
        }


def _serve_with_probe(report_path: Path, serve_args: list[str]) -> int:
    """Child: `pora serve` with the probes, report written at exit."""
    from pora.cli import main  # noqa: PLC0415
    from pora.server import daemon  # noqa: PLC0415

    probe = _Probe()
    run_daemon = daemon.run_daemon

    async def run_daemon_probed(
        settings: Settings, *, on_ready: Callable[[dict[str, Any]], None] | None = None
    ) -> int:
        trio.lowlevel.add_instrument(probe.steps)
        gc.callbacks.append(probe.on_gc)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe.sleep_loop)
            status = await run_daemon(settings, on_ready=on_ready)
            nursery.cancel_scope.cancel()
        return status

    daemon.run_daemon = run_daemon_probed
    try:
        return main(["serve", *serve_args])
    finally:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        report = probe.report() | {
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "context_switches": usage.ru_nvcsw + usage.ru_nivcsw,
        }
        report_path.write_text(json.dumps(report))


def _meminfo_kib(*names: str) -> dict[str, int]:
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in names:
            values[name] = int(rest.split()[0])
    return values


class _DirtySampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_kib = {"Dirty": 0, "Writeback": 0}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(1.0):
            for name, kib in _meminfo_kib("Dirty", "Writeback").items():
                self.peak_kib[name] = max(self.peak_kib[name], kib)


class _DirtyWriter(threading.Thread):
    """Buffered writes (no sync) as fast as the kernel takes them, into a file that
    starts over at `cap_bytes`: holds the machine at its dirty-page limits, where the
    kernel throttles every process that dirties pages, the node's writes included."""

    def __init__(self, path: Path, cap_bytes: int) -> None:
        super().__init__(daemon=True)
        self.path, self.cap_bytes = path, cap_bytes
        self.written = 0
        self.stop = threading.Event()

    def run(self) -> None:
        chunk = b"\xa5" * (1 << 20)
        with self.path.open("wb") as file:
            while not self.stop.is_set():
                if file.tell() >= self.cap_bytes:
                    file.seek(0)
                    file.truncate()
                file.write(chunk)
                self.written += len(chunk)
        self.path.unlink()


def _du_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return _serve_with_probe(Path(sys.argv[2]), sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=300)
    parser.add_argument("--dir", default=None, help="parent of the temp data dir")
    parser.add_argument("--node-option", action="append", default=[])
    parser.add_argument(
        "--dirty-writer-gib",
        type=float,
        default=0,
        help="also write this many GiB over and over without syncing, beside the node "
        "(default 0: none)",
    )
    parser.add_argument("bench_args", nargs="*", help="more `pora bench` arguments")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pora-stall-", dir=args.dir) as directory:
        root = Path(directory)
        ready, report = root / "ready.json", root / "report.json"
        command = [
            sys.executable, __file__, "--child", str(report),
            "--data-dir", str(root / "data"), "--listen", "127.0.0.1:0",
            "--ready-file", str(ready), "--log-level", "warning",
        ]  # fmt: skip
        for option in args.node_option:
            command += ["--node-option", option]
        server = subprocess.Popen(command)
        try:
            while not ready.exists():
                if server.poll() is not None:
                    raise SystemExit(f"pora serve exited with {server.returncode}")
                time.sleep(0.05)
            address = json.loads(ready.read_text())["listen"]
            sampler = _DirtySampler()
            sampler.start()
            writer = _DirtyWriter(root / "dirty", int(args.dirty_writer_gib * (1 << 30)))
            if args.dirty_writer_gib > 0:
                writer.start()
            bench = [
                sys.executable, "-m", "pora.cli", "bench", "--connect", address,
                "--no-redis", "--rounds", "1", "--duration-s", str(args.duration_s),
                "--json", *args.bench_args,
            ]  # fmt: skip
            result = subprocess.run(bench, check=True, capture_output=True, text=True)
            sampler.stop.set()
            writer.stop.set()
            if writer.is_alive():
                writer.join()
            written = _du_bytes(root / "data")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=600)
        dirty = {p.name: int(p.read_text()) for p in Path("/proc/sys/vm").glob("dirty_*")}
        print(
            json.dumps(
                {
                    "bench": json.loads(result.stdout),
                    "probe": json.loads(report.read_text()),
                    "data_dir_bytes_at_end": written,
                    "peak_kib": sampler.peak_kib,
                    "dirty_writer_bytes": writer.written,
                    "vm_dirty": dirty,
                    "load_average": os.getloadavg(),
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
