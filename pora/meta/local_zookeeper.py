"""A standalone ZooKeeper server on this machine, run as a child process from Debian's
`zookeeper` package: for tests, the metadata benchmark and local clusters.

`LocalZooKeeper(directory)` writes `zoo.cfg` and keeps its data and its log
(`zookeeper.log`) in `directory`, listens on a free loopback port (kept across
restarts), turns the admin server off and uses a short tick so that session timeouts
down to a few hundred milliseconds are allowed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

JAVA = Path("/usr/bin/java")
#: the jar's manifest names its dependencies; slf4j-simple sends the log to stderr
CLASSPATH = (Path("/usr/share/java/zookeeper.jar"), Path("/usr/share/java/slf4j-simple.jar"))
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEFAULT_TICK_MS = 100
#: a session may ask for up to a minute, whatever the tick
SESSION_TIMEOUT_MAX_MS = 60_000
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PROBE_INTERVAL_S = 0.05
INSTALL_HINT = "install Debian's ZooKeeper server: apt-get install zookeeper"


class ZooKeeperLaunchError(RuntimeError):
    """The local ZooKeeper server could not be started."""


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def four_letter_word(port: int, word: str, timeout_s: float = 1.0) -> str:
    """Send one of ZooKeeper's four-letter commands and return its answer ('' if the
    server is not answering)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
            conn.sendall(word.encode())
            chunks: list[bytes] = []
            while chunk := conn.recv(4096):
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode(errors="replace")


class LocalZooKeeper:
    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        tick_ms: int = DEFAULT_TICK_MS,
        force_sync: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.port = port if port is not None else free_loopback_port()
        self.tick_ms = tick_ms
        self.force_sync = force_sync
        self.log_path = self.directory / "zookeeper.log"
        self.config_path = self.directory / "zoo.cfg"
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, chroot: str = "/pora") -> str:
        return f"zk://127.0.0.1:{self.port}/{chroot.lstrip('/')}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _write_config(self) -> None:
        data_dir = self.directory / "data"
        data_dir.mkdir(parents=True, exist_ok=True)
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={data_dir}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            f"minSessionTimeout={2 * self.tick_ms}",
            f"maxSessionTimeout={SESSION_TIMEOUT_MAX_MS}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,mntr,stat,cons",
            f"forceSync={'yes' if self.force_sync else 'no'}",
            "maxClientCnxns=0",  # tests open many sessions from one address
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def _command(self) -> list[str]:
        missing = [path for path in (JAVA, *CLASSPATH) if not path.exists()]
        if missing:
            raise ZooKeeperLaunchError(
                f"cannot start a local ZooKeeper: {', '.join(map(str, missing))} missing; "
                + INSTALL_HINT
            )
        classpath = os.pathsep.join(str(path) for path in CLASSPATH)
        return [
            str(JAVA),
            "-Xmx256m",
            "-XX:+UseSerialGC",  # small and quick to start on a shared machine
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            MAIN_CLASS,
            str(self.config_path),
        ]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the server (again, on the same port and data) and wait until it
        answers `ruok`."""
        if self.running:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        self._write_config()
        command = self._command()
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_until_serving(timeout_s)

    def _wait_until_serving(self, timeout_s: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ZooKeeperLaunchError(
                    f"local ZooKeeper on 127.0.0.1:{self.port} exited with status "
                    f"{self._process.returncode} at start; see {self.log_path}"
                )
            # ruok answers as soon as the port is open; srvr only once the server serves
            if "Zookeeper version" in four_letter_word(self.port, "srvr"):
                return
            time.sleep(PROBE_INTERVAL_S)
        self.kill()
        raise ZooKeeperLaunchError(
            f"local ZooKeeper on 127.0.0.1:{self.port} did not answer within {timeout_s} s "
            f"(is the port taken? is Java working?); see {self.log_path}"
        )

    def stop(self) -> None:
        """A clean stop (SIGTERM), SIGKILL if it does not exit in time."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def kill(self) -> None:
        """SIGKILL: the server stops at once, as in a crash."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        self._process = None

    def __enter__(self) -> LocalZooKeeper:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
