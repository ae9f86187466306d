"""Every function of the project that one `ledger.append(b"x")` runs, in the order
first called: the count behind docs/architecture.md's walk of the write path.

Three nodes are served on loopback in this process (each its own `Server` and data
dir), registered in a temp SQLite metadata store; a `pora.connect` client makes one
E=3 Qw=3 Qa=2 ledger, appends once to warm up (connections opened, identities
learnt, on every node), then appends `b"x"` under a profiler of every thread. The functions of
`journal`, `ledger`, `netio` and `pora` that ran until the append returned are
printed with their modules, the journal's fdatasyncs (in worker threads) in their
places; a comprehension counts as part of its function. Other tasks that ran
meanwhile (a sweeper, a timer) are counted too: the figure is an upper bound.

    python scripts/trace_append.py [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import trio
import trio.testing

import pora
from pora.meta import open_metadata
from pora.meta.records import NodeRegistration
from pora.node.node import Node
from pora.server.server import Server, ServerConfig

ROOT = Path(pora.__file__).resolve().parent.parent
PACKAGES = ("journal", "ledger", "netio", "pora")
COMPREHENSIONS = ("<listcomp>", "<genexpr>", "<dictcomp>", "<setcomp>")
FDATASYNC = ("os", "fdatasync")


@dataclass
class Trace:
    """What the profiler saw, in the order first seen (fdatasyncs each time)."""

    order: list[tuple[str, str]] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: recording: the profiler is set from the start, so that the worker threads
    #: trio starts (and keeps for reuse) have it, and records only while this is on
    on: bool = False

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if not self.on:
            return
        if event == "c_call" and getattr(arg, "__name__", "") == "fdatasync":
            with self.lock:
                self.order.append(FDATASYNC)
            return
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if not path.is_relative_to(ROOT):
            return
        module = path.relative_to(ROOT).as_posix()
        if not module.startswith(tuple(f"{p}/" for p in PACKAGES)):
            return
        name = frame.f_code.co_qualname
        for comprehension in COMPREHENSIONS:
            name = name.split(f".<locals>.{comprehension}")[0]
        key = (module, name)
        with self.lock:
            if key not in self.seen:
                self.seen.add(key)
                self.order.append(key)

    def functions(self) -> list[tuple[str, str]]:
        return [key for key in self.order if key != FDATASYNC]

    def modules(self) -> list[str]:
        return list(dict.fromkeys(module for module, _ in self.functions()))


async def _run_node(data_dir: Path, *, task_status: trio.TaskStatus[Node]) -> None:
    async with pora.open_node(data_dir) as node:
        task_status.started(node)
        await trio.sleep_forever()


async def trace_append() -> Trace:
    """The trace of one append on a fresh three-node cluster in this process."""
    trace = Trace()
    sys.setprofile(trace.profile)
    threading.setprofile(trace.profile)
    try:
        await _append_traced(trace)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return trace


async def _append_traced(trace: Trace) -> None:
    with tempfile.TemporaryDirectory(prefix="pora-trace-") as directory:
        url = f"sqlite://{Path(directory) / 'meta.db'}"
        async with trio.open_nursery() as nursery:
            servers: list[Server] = []
            nodes: list[Node] = []
            async with open_metadata(url) as store:
                for index in range(3):
                    node = await nursery.start(_run_node, Path(directory) / f"node-{index}")
                    server = Server(node, ServerConfig(port=0))
                    host, port = await nursery.start(server.run)
                    servers.append(server)
                    nodes.append(node)
                    address = f"{host}:{port}"
                    async with pora.connect_node(address) as one:
                        identity = await one.identity()
                    registration = NodeRegistration(address, identity.instance_id)
                    await store.register_node(registration, lease_s=600)
            async with pora.connect(url, rng=random.Random(1)) as client:
                ledger = await client.create_ledger(3, 3, 2)
                await ledger.append(b"w")
                for node in nodes:  # the third node too, its ledger worker started
                    await node.read_entry(ledger.ledger_id, 0, wait_s=10.0)
                # and its answer read by the client: every task idle for a while
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                trace.on = True
                try:
                    await ledger.append(b"x")
                finally:
                    trace.on = False
                await ledger.close()
            for server in servers:
                await server.shutdown(drain_timeout_s=1.0)
            nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    trace = trio.run(trace_append)
    functions, modules = trace.functions(), trace.modules()
    if args.json:
        walk = [{"module": module, "function": name} for module, name in trace.order]
        print(json.dumps({"walk": walk, "functions": len(functions), "modules": len(modules)}))
        return
    for module, name in trace.order:
        print(f"{module:44} {name}")
    print(f"{len(functions)} functions in {len(modules)} modules")


if __name__ == "__main__":
    main()
