"""`pora serve` as a real subprocess: used through the client, stopped with signals."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from serve_helpers import http_get, samples

import pora
from pora.cli import main

START_TIMEOUT_S = 30.0


@dataclass
class Daemon:
    process: trio.Process
    address: str
    metrics_port: int | None
    log_path: Path

    def log_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line]


@asynccontextmanager
async def serve(
    data_dir: Path, tmp_path: Path, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[Daemon]:
    """Start `pora serve` on a free port; kill it at the end if the test did not stop it."""
    ready = tmp_path / f"ready-{os.urandom(4).hex()}.json"
    log_path = tmp_path / f"serve-{os.urandom(4).hex()}.log"
    command = [
        sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
        "--listen", "127.0.0.1:0", "--ready-file", str(ready), *extra,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            command, stderr=log, env={**os.environ, **(env or {})}
        )
    try:
        with trio.fail_after(START_TIMEOUT_S):
            while not ready.exists():
                assert process.poll() is None, log_path.read_text()
                await trio.sleep(0.02)
        addresses = json.loads(ready.read_text())
        metrics = addresses.get("metrics_listen")
        yield Daemon(
            process, addresses["listen"], int(metrics.rsplit(":", 1)[1]) if metrics else None,
            log_path,
        )  # fmt: skip
    finally:
        if process.poll() is None:
            process.kill()
        await process.wait()


async def stop(daemon: Daemon, signum: int = signal.SIGTERM) -> int:
    daemon.process.send_signal(signum)
    with trio.fail_after(START_TIMEOUT_S):
        return await daemon.process.wait()


async def write_until_stopped(
    address: str,
    ledger_id: int,
    acknowledged: list[int],
    enough: trio.Event,
    enough_count: int,
    writers: int = 8,
) -> None:
    """Keep adds in flight until the node goes away; record every acknowledged one.

    Sets `enough` once `enough_count` adds are acknowledged.
    """
    next_entry = 0
    async with pora.connect_node(address) as client:

        async def writer() -> None:
            nonlocal next_entry
            while True:
                entry_id = next_entry
                next_entry += 1
                try:
                    await client.add_entry(ledger_id, entry_id, b"%d" % entry_id)
                except Exception:  # the node stopped: unacknowledged, may or may not be there
                    return
                acknowledged.append(entry_id)
                if len(acknowledged) >= enough_count:
                    enough.set()

        async with trio.open_nursery() as nursery:
            for _ in range(writers):
                nursery.start_soon(writer)


async def assert_all_there(address: str, ledger_id: int, acknowledged: list[int]) -> None:
    assert acknowledged, "no add was acknowledged before the stop"
    async with pora.connect_node(address) as client:
        for entry_id in acknowledged:
            assert await client.read_entry(ledger_id, entry_id) == b"%d" % entry_id


@pytest.mark.slow
async def test_the_drain_log_line_says_what_the_server_did(data_dir: Path, tmp_path: Path) -> None:
    async with serve(data_dir, tmp_path) as daemon:
        async with pora.connect_node(daemon.address) as client:
            for entry_id in range(3):
                await client.add_entry(4, entry_id, b"x")
        assert await stop(daemon) == 0
        (drained,) = [line for line in daemon.log_lines() if str(line["msg"]).startswith("drained")]
    assert drained["connections_accepted"] == 1
    assert drained["connections_open"] == 0
    assert drained["protocol_errors"] == 0
    assert drained["requests"] == 4  # the 3 adds and the INFO a client asks first
    assert drained["requests_inflight"] == 0
    assert drained["responses_failed"] == 0
    assert isinstance(drained["bytes_received"], int)
    assert drained["bytes_received"] > 0
    assert isinstance(drained["bytes_sent"], int)
    assert drained["bytes_sent"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_signal_stops_cleanly_and_nothing_acknowledged_is_lost(
    data_dir: Path, tmp_path: Path, signum: int
) -> None:
    acknowledged: list[int] = []
    async with serve(data_dir, tmp_path) as daemon:
        async with trio.open_nursery() as nursery:
            assert daemon.metrics_port is None  # metrics are off by default
            enough = trio.Event()
            nursery.start_soon(write_until_stopped, daemon.address, 5, acknowledged, enough, 300)
            await enough.wait()
            assert await stop(daemon, signum) == 0
        messages = [str(line["msg"]) for line in daemon.log_lines()]
        assert any(m.startswith("recovered in") for m in messages)
        assert any(m.startswith("received SIG") for m in messages)
        assert any(m.startswith("stopped cleanly") for m in messages)
    async with serve(data_dir, tmp_path) as daemon:
        await assert_all_there(daemon.address, 5, acknowledged)
        # a clean stop flushed everything: nothing is left to replay
        recovered = [str(m["msg"]) for m in daemon.log_lines() if "recovered" in str(m["msg"])]
        assert len(recovered) == 1
        assert "0 segments, 0 of 0 records replayed" in recovered[0]
        assert await stop(daemon) == 0


@pytest.mark.slow
async def test_sigkill_then_restart_keeps_every_acknowledged_entry(
    data_dir: Path, tmp_path: Path
) -> None:
    acknowledged: list[int] = []
    async with serve(data_dir, tmp_path) as daemon, trio.open_nursery() as nursery:
        enough = trio.Event()
        nursery.start_soon(write_until_stopped, daemon.address, 9, acknowledged, enough, 500)
        await enough.wait()
        assert await stop(daemon, signal.SIGKILL) == -signal.SIGKILL
    async with serve(data_dir, tmp_path) as daemon:
        await assert_all_there(daemon.address, 9, acknowledged)
        recovered = [str(m["msg"]) for m in daemon.log_lines() if "recovered" in str(m["msg"])]
        found = re.search(r"(\d+) of (\d+) records replayed", recovered[0])
        assert found is not None, recovered
        assert int(found[1]) >= len(acknowledged)  # the journal brought them back
        assert await stop(daemon) == 0


@pytest.mark.slow
async def test_metrics_health_and_read_only_mode_of_a_served_node(
    data_dir: Path, tmp_path: Path
) -> None:
    config = tmp_path / "pora.toml"
    config.write_text(
        'metrics_listen = "127.0.0.1:0"\nlog_format = "json"\n[node]\ntrim_interval_ms = 500\n'
    )
    async with serve(data_dir, tmp_path, "--config", str(config)) as daemon:
        assert daemon.metrics_port is not None
        async with pora.connect_node(daemon.address) as client:
            for entry_id in range(50):
                await client.add_entry(11, entry_id, b"m" * 1024)
            with pytest.raises(pora.NoSuchEntry):
                await client.read_entry(11, 999)
        status, text = await http_get(daemon.metrics_port, "/metrics")
        assert status == 200
        values = samples(text)
        assert values["pora_journal_records_total"] >= 50
        assert values["pora_journal_bytes_total"] >= 50 * 1024
        assert values["pora_journal_fsync_seconds_count"] >= 1
        errors = {k: v for k, v in values.items() if k.startswith("pora_server_errors_total")}
        assert sum(errors.values()) >= 1, sorted(values)
        assert await http_get(daemon.metrics_port, "/health") == (200, "ok\n")
        assert await stop(daemon) == 0

    # the same data dir with a threshold no disk meets: read-only from the start
    async with serve(
        data_dir,
        tmp_path,
        "--metrics-listen", "127.0.0.1:0",
        env={"PORA_READ_ONLY_FREE_BYTES_MIN": "1000000TiB"},
    ) as daemon:  # fmt: skip
        assert daemon.metrics_port is not None
        async with pora.connect_node(daemon.address) as client:
            with pytest.raises(pora.NodeReadOnly):
                await client.add_entry(11, 50, b"refused")
            assert await client.read_entry(11, 49) == b"m" * 1024
        status, body = await http_get(daemon.metrics_port, "/health")
        assert status == 503
        assert "disk nearly full" in body
        assert samples((await http_get(daemon.metrics_port, "/metrics"))[1])["pora_read_only"] == 1
        assert any(
            line["level"] == "warning" and "read-only" in str(line["msg"])
            for line in daemon.log_lines()
        )
        assert await stop(daemon) == 0


@pytest.mark.slow
async def test_a_locked_data_dir_is_refused_with_a_clear_error(
    data_dir: Path, tmp_path: Path
) -> None:
    async with serve(data_dir, tmp_path) as daemon:
        second = await trio.run_process(
            [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
             "--listen", "127.0.0.1:0", "--log-format", "logfmt"],
            capture_stderr=True, check=False,
        )  # fmt: skip
        assert second.returncode == 2  # a refusal, as for the offline tools
        assert b"cannot serve" in second.stderr
        assert b"level=error" in second.stderr
        assert await stop(daemon) == 0


def test_bad_settings_exit_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--listen", "nowhere"]) == 2
    assert "bad value for listen in flag --listen" in capsys.readouterr().err
    assert main(["serve", "--node-option", "group_wait_ms=1"]) == 2
    assert "unknown node option 'group_wait_ms'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--drain-timeout-s", "nan"], "expected a finite number, got 'nan'"),
        (["--drain-timeout-s", "-3"], "drain_timeout_s must be a finite number of seconds >= 0"),
        (["--server-option", "connections_max=0"], "connections_max must be at least 1"),
    ],
)
def test_values_that_would_fail_later_are_refused_before_starting(
    argv: list[str], expected: str, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", *argv]) == 2
    assert expected in capsys.readouterr().err
    assert not data_dir.exists()  # refused before the node touched anything


def refused_start(*argv: str, pora_command: list[str] | None = None) -> str:
    """Run `pora serve` that must refuse to start: exit status 2 and one error line,
    no traceback. Returns that line. `pora_command` is what runs `pora` (by default
    this interpreter, as this user)."""
    result = subprocess.run(
        [*(pora_command or [sys.executable, "-m", "pora.cli"]), "serve",
         "--log-format", "logfmt", *argv],
        capture_output=True, text=True, timeout=60, check=False, cwd="/",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "level=error" in line]
    return line


def test_a_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a data dir")
    line = refused_start("--data-dir", str(a_file), "--listen", "127.0.0.1:0")
    assert f"{a_file} is a file, not a directory. Point --data-dir at" in line


def test_a_listen_address_in_use_is_refused(data_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused_start("--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}")
    assert f"127.0.0.1:{port} is in use by another process" in line
    assert "choose another port (--listen)" in line


@pytest.mark.slow
def test_a_listen_address_not_on_this_machine_is_refused(data_dir: Path) -> None:
    # 192.0.2.0/24 is for documentation (RFC 5737): no machine has it
    line = refused_start("--data-dir", str(data_dir), "--listen", "192.0.2.1:3181")
    assert "cannot listen on 192.0.2.1:3181 for the node: no such address on this machine" in line
    line = refused_start(
        "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--metrics-listen", "192.0.2.1:1"
    )
    assert "cannot listen on 192.0.2.1:1 for metrics: no such address" in line
    assert "(--metrics-listen)" in line


#: `pora` run as another user (argv: uid, gid, then pora's arguments). The interpreter
#: starts as root and imports every module of the node's packages (the command imports
#: some of them lazily) before it drops to that user's ids and parses its arguments: the
#: user never reads the checkout, which may lie in a folder only root can enter (a home
#: directory, a `mktemp -d` folder), while the data dir check runs with that user's
#: rights alone (`os.access` asks about the real uid: it is the user's too).
PORA_AS_ANOTHER_USER = """
import importlib, os, pkgutil, sys
import journal, ledger, netio, pora, pora.cli
for package in (journal, ledger, netio, pora):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not module.name.endswith(".__main__"):  # (that one runs the command)
            importlib.import_module(module.name)
parser = pora.cli.build_parser()
uid, gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([])
os.setgid(gid)
os.setuid(uid)  # from root to another uid: every capability goes too
assert (os.getuid(), os.geteuid()) == (uid, uid)
args = parser.parse_args(sys.argv[3:])
sys.exit(args.run(args))
"""


@pytest.fixture
def unwritable_dir() -> Iterator[tuple[Path, list[str], str]]:
    """A folder the node's user cannot write, the command that runs `pora` as that
    user, and the user's name: `nobody` when the tests run as root (root may write
    anywhere), else the tests' own user."""
    parent = Path(tempfile.mkdtemp(prefix="pora-unwritable-"))
    parent.chmod(0o755)  # reachable by another user (pytest's tmp_path is not)
    folder = parent / "data"
    folder.mkdir()
    folder.chmod(0o555)
    command = [sys.executable, "-m", "pora.cli"]
    user = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        command = [sys.executable, "-c", PORA_AS_ANOTHER_USER]
        command += [str(nobody.pw_uid), str(nobody.pw_gid)]
        user = nobody.pw_name
    try:
        yield folder, command, user
    finally:
        folder.chmod(0o755)
        shutil.rmtree(parent)


@pytest.mark.slow
def test_a_data_dir_this_user_cannot_write_is_refused(
    unwritable_dir: tuple[Path, list[str], str],
) -> None:
    folder, pora_command, user = unwritable_dir
    argv = ("--listen", "127.0.0.1:0")
    line = refused_start("--data-dir", str(folder), *argv, pora_command=pora_command)
    assert f"the data dir ({folder}) is not writable by {user} (uid " in line
    assert "with mode 555" in line
    assert "Run the node as the user that owns the data dir" in line
    # a data dir to be made inside it: the folder it would be made in is named
    new = folder / "new"
    line = refused_start("--data-dir", str(new), *argv, pora_command=pora_command)
    assert f"the folder in which to make data dir {new} ({folder})" in line


@pytest.mark.parametrize("command", ["serve", "bench"])
def test_help(command: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", command, "--help"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert f"usage: pora {command}" in result.stdout
    if command == "serve":
        for text in ("--data-dir", "PORA_LISTEN", "--metrics-listen", "SIGTERM", "[node]"):
            assert text in result.stdout
    else:
        for text in ("--connections", "--depth", "--json", "redis-server"):
            assert text in result.stdout
