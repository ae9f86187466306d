"""`pora cluster`: a local cluster in one command, N `pora serve` processes registered
in one metadata store (an SQLite file in the cluster's folder unless `--metadata`
names another), watched until Ctrl-C or SIGTERM stops them all."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

if TYPE_CHECKING:
    from pora.meta.records import NodeRegistration
    from pora.meta.store import MetadataStore

EXIT_REFUSED: Final = 2
#: lines of a node's log shown when it fails to start
LOG_TAIL_LINES: Final = 5
POLL_INTERVAL_S: Final = 0.1
HEALTH_INTERVAL_S: Final = 1.0

EPILOG = """\
Layout (made on the first run, reused after): DIR/node-K is node K's data dir,
DIR/node-K.log its output, DIR/meta.db the SQLite metadata store. Node K listens
on 127.0.0.1:BASE_PORT+K (3181, 3182, ... by default).

Once every node is registered, the command prints the metadata URL clients use
(sqlite:///abs/DIR/meta.db) and a line per node (address, registered, free space,
read-only), then a line for every change: a node that turns read-only, loses its
registration or exits (with its exit status and log). A node that dies does not
stop the others.

Ctrl-C or SIGTERM stops every node with SIGTERM and waits for them (up to
--stop-timeout-s, then SIGKILL, said so). Exit status: 0 when every node stopped
cleanly, 1 when one did not (it died, failed to start, or had to be killed), 2 when
the cluster cannot start as asked (bad arguments, the metadata store unreachable).
"""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "cluster",
        help="run a local cluster: N nodes registered in one metadata store",
        description="Start N `pora serve` nodes on this machine, registered in one "
        "metadata store, and watch them until Ctrl-C.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nodes", type=int, required=True, metavar="N", help="how many nodes to run"
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path("./pora-cluster"),
        metavar="DIR",
        help="folder of the nodes' data dirs, logs and metadata (default: ./pora-cluster)",
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=3180,
        metavar="PORT",
        help="node K listens on 127.0.0.1:PORT+K (default: 3180, so 3181..)",
    )
    parser.add_argument(
        "--metadata",
        default=None,
        metavar="URL",
        help="an existing metadata store to register in, like zk://host:2181/pora "
        "(default: sqlite:///abs/DIR/meta.db)",
    )
    parser.add_argument(
        "--start-timeout-s",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long every node may take to start and register (default: 60)",
    )
    parser.add_argument(
        "--stop-timeout-s",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long nodes may take to stop before they are killed (default: 30)",
    )
    parser.add_argument(
        "--node-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="pass ARG on to every `pora serve` (repeatable), like "
        "--node-arg=--registration-lease-s=2",
    )
    parser.set_defaults(run=run)


@dataclass
class ClusterNode:
    number: int
    address: str
    data_dir: Path
    log_path: Path
    process: trio.Process | None = None
    exit_status: int | None = None
    exited: trio.Event = field(default_factory=trio.Event)
    #: the last health line shown, so only changes are shown again
    shown: str = ""

    @property
    def name(self) -> str:
        return f"node-{self.number}"


def _say(text: str) -> None:
    print(text, flush=True)


def _fail(text: str) -> None:
    print(f"pora cluster: {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        _fail(f"--nodes must be at least 1, got {args.nodes}")
        return EXIT_REFUSED
    if args.base_port < 0 or args.base_port + args.nodes > 65535:
        _fail(f"--base-port {args.base_port} with {args.nodes} nodes passes port 65535")
        return EXIT_REFUSED
    if args.metadata is not None and not args.metadata.strip():
        # an unset shell variable (`--metadata "$URL"`): not the local store in --dir
        _fail("--metadata is empty: give a store's URL, or leave it out for a local one")
        return EXIT_REFUSED
    if args.metadata is not None:
        from pora.meta.backends import check_metadata_url  # noqa: PLC0415
        from pora.meta.errors import MetadataUnavailable  # noqa: PLC0415 (keeps --help light)

        try:
            check_metadata_url(args.metadata)  # before anything is made in --dir
        except MetadataUnavailable as error:
            _fail(str(error))
            return EXIT_REFUSED
    folder: Path = args.dir.absolute()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _fail(f"cannot make the cluster folder {folder}: {error.strerror} (choose --dir)")
        return EXIT_REFUSED
    # sqlite:// and the absolute path: sqlite:///abs/DIR/meta.db
    url = args.metadata or f"sqlite://{folder / 'meta.db'}"
    nodes = [
        ClusterNode(
            k,
            f"127.0.0.1:{args.base_port + k}",
            folder / f"node-{k}",
            folder / f"node-{k}.log",
        )
        for k in range(1, args.nodes + 1)
    ]
    cluster = Cluster(nodes, url, args.node_arg, args.start_timeout_s, args.stop_timeout_s)
    return trio.run(cluster.main)


class Cluster:
    def __init__(
        self,
        nodes: list[ClusterNode],
        url: str,
        node_args: list[str],
        start_timeout_s: float,
        stop_timeout_s: float,
    ) -> None:
        self.nodes = nodes
        self.url = url
        self.node_args = node_args
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.stop_requested = trio.Event()
        self.stopping = False
        #: past startup: a node's exit is news to show, not a startup failure
        self.watching = False
        self.clean = True

    async def main(self) -> int:
        from pora.meta.backends import open_metadata  # noqa: PLC0415
        from pora.meta.errors import MetadataUnavailable  # noqa: PLC0415 (keeps --help light)

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            try:
                async with open_metadata(self.url) as store, trio.open_nursery() as nursery:
                    nursery.start_soon(self._watch_signals, signals)
                    try:
                        await self._run(store, nursery)
                    finally:
                        with trio.CancelScope(shield=True):
                            await self._stop_all()
                    nursery.cancel_scope.cancel()
            except MetadataUnavailable as error:
                _fail(f"{error}; check the store, or leave out --metadata for a local one")
                return EXIT_REFUSED
        return 0 if self.clean else 1

    async def _watch_signals(self, signals: AsyncIterator[int]) -> None:
        async for signum in signals:
            _say(f"received {signal.Signals(signum).name}: stopping every node")
            self.stop_requested.set()

    async def _run(self, store: MetadataStore, nursery: trio.Nursery) -> None:
        _say(f"starting {len(self.nodes)} nodes in {self.nodes[0].data_dir.parent}")
        for node in self.nodes:
            await self._start(node, nursery)
        if not await self._wait_registered(store):
            self.clean = False
            return
        _say(f"metadata URL: {self.url}")
        await self._show_health(store, every_line=True)
        _say(f"ready: {len(self.nodes)} nodes; Ctrl-C stops them")
        self.watching = True
        while not self.stop_requested.is_set():
            with trio.move_on_after(HEALTH_INTERVAL_S):
                await self.stop_requested.wait()
            await self._show_health(store, every_line=False)

    async def _start(self, node: ClusterNode, nursery: trio.Nursery) -> None:
        command = [
            sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(node.data_dir),
            "--listen", node.address, "--metadata", self.url, "--log-format", "logfmt",
            *self.node_args,
        ]  # fmt: skip
        with node.log_path.open("wb") as log:
            # a session of its own: a Ctrl-C at the terminal reaches this command only,
            # which stops each node with one SIGTERM (a second would cut its drain short)
            node.process = await trio.lowlevel.open_process(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )  # fmt: skip
        nursery.start_soon(self._watch_exit, node)

    async def _watch_exit(self, node: ClusterNode) -> None:
        assert node.process is not None
        node.exit_status = await node.process.wait()
        node.exited.set()
        if not self.stopping:
            self.clean = False
        if self.watching and not self.stopping:
            _say(
                f"{node.name} {node.address} exited with status "
                f"{_status_text(node.exit_status)}; log: {node.log_path}; the other nodes "
                "keep running"
            )

    async def _wait_registered(self, store: MetadataStore) -> bool:
        """True once every node is registered; False (said why) if one exits first,
        the timeout passes or a stop is asked for."""
        from pora.meta.errors import MetadataError  # noqa: PLC0415

        with trio.move_on_after(self.start_timeout_s):
            while not self.stop_requested.is_set():
                failed = [node for node in self.nodes if node.exited.is_set()]
                if failed:
                    for node in failed:
                        _fail(
                            f"{node.name} ({node.address}) exited with status "
                            f"{_status_text(node.exit_status)} before it registered; its log "
                            f"{node.log_path} says why:\n{_tail(node.log_path)}"
                        )
                    return False
                try:
                    registered = {n.address for n in await store.list_nodes()}
                except MetadataError as error:
                    _fail(f"cannot read the registrations: {error}")
                    return False
                if all(node.address in registered for node in self.nodes):
                    return True
                await trio.sleep(POLL_INTERVAL_S)
            return False
        registered = {n.address for n in await store.list_nodes()}
        for node in self.nodes:
            if node.address not in registered:
                _fail(
                    f"{node.name} ({node.address}) did not register within "
                    f"{self.start_timeout_s:g}s; its log {node.log_path} ends with:\n"
                    f"{_tail(node.log_path)}"
                )
        return False

    async def _show_health(self, store: MetadataStore, *, every_line: bool) -> None:
        from pora.meta.errors import MetadataError  # noqa: PLC0415

        try:
            registrations = {n.address: n for n in await store.list_nodes()}
        except MetadataError as error:
            _say(f"cannot read the registrations: {error}")
            return
        for node in self.nodes:
            line = _health_line(node, registrations.get(node.address))
            if every_line or line != node.shown:
                _say(line)
            node.shown = line

    async def _stop_all(self) -> None:
        self.stopping = True
        running = [n for n in self.nodes if n.process is not None and not n.exited.is_set()]
        for node in running:
            assert node.process is not None
            node.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(self.stop_timeout_s):
            for node in running:
                await node.exited.wait()
        for node in running:
            assert node.process is not None
            if not node.exited.is_set():
                _say(
                    f"{node.name} {node.address} did not stop within {self.stop_timeout_s:g}s: "
                    f"killing it (SIGKILL); log: {node.log_path}"
                )
                node.process.kill()
                await node.exited.wait()
                self.clean = False
            elif node.exit_status != 0:
                self.clean = False
                _say(
                    f"{node.name} {node.address} stopped with status "
                    f"{_status_text(node.exit_status)}; log: {node.log_path}"
                )
        if running:
            _say("every node stopped" + ("" if self.clean else " (not all cleanly)"))


def _health_line(node: ClusterNode, registration: NodeRegistration | None) -> str:
    if node.exited.is_set():
        return f"{node.name} {node.address}: exited, status {_status_text(node.exit_status)}"
    if registration is None:
        return f"{node.name} {node.address}: running, not registered"
    mode = "read-only" if registration.read_only else "writable"
    return (
        f"{node.name} {node.address}: registered, "
        f"{registration.free_bytes / (1 << 30):.1f} GiB free, {mode}"
    )


def _status_text(status: int | None) -> str:
    if status is not None and status < 0:
        return f"{status} (killed by {signal.Signals(-status).name})"
    return str(status)


def _tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError as error:
        return f"  (cannot read it: {error.strerror})"
    return "\n".join(f"  {line}" for line in lines[-LOG_TAIL_LINES:]) or "  (empty)"
