"""`pora ledger show | read | tail | recover ID --metadata URL` against real `pora serve`
processes: a replicated ledger with one node killed reads in full, a tail follows a
live writer's appends, and `recover` closes a ledger whose writer was SIGKILLed at
the last entry it had acknowledged (or later)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from test_node_registration import Node, serve, stop
from waiting import wait_until

import pora

PASSWORD = "pw"
WRITER_SCRIPT = Path(__file__).with_name("replication_writer_process.py")


@asynccontextmanager
async def three_nodes(tmp_path: Path) -> AsyncIterator[tuple[str, list[Node]]]:
    url = f"sqlite://{tmp_path}/meta.db"
    async with AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(serve(tmp_path / name, tmp_path, url)) for name in "abc"
        ]
        yield url, nodes


async def pora_cli(*argv: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    result = await trio.run_process(
        [sys.executable, "-m", "pora.cli", *argv], capture_stdout=True, capture_stderr=True,
        check=False,
    )  # fmt: skip
    if check:
        assert result.returncode == 0, result.stderr.decode()
    return result


async def cluster_status(url: str) -> dict[str, Any]:
    result = await pora_cli("status", "--metadata", url, "--json")
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def json_lines(output: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.decode().splitlines()]


def payload(entry_id: int) -> bytes:
    return b"entry %d " % entry_id + bytes(range(entry_id % 50))


@pytest.mark.slow
async def test_a_ledger_with_one_node_killed_reads_in_full(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as (url, nodes):
        async with pora.connect(url) as client:
            ledger = await client.create_ledger(3, 3, 2, password=PASSWORD)
            for entry_id in range(30):
                await ledger.append(payload(entry_id))
            await ledger.close()
        assert await stop(nodes[2], signal.SIGKILL) == -signal.SIGKILL
        ledger_id = str(ledger.ledger_id)
        common = ("--metadata", url, "--password", PASSWORD)

        read = await pora_cli("ledger", "read", ledger_id, *common, "--json")
        entries = json_lines(read.stdout)
        assert [e["entry_id"] for e in entries] == list(range(30))
        assert all(e["ledger_id"] == ledger.ledger_id for e in entries)
        hex_lines = (
            await pora_cli("ledger", "read", ledger_id, *common, "--from", "5", "--to", "7")
        ).stdout
        assert hex_lines.decode().splitlines() == [
            f"{i}\t{len(payload(i))}\t{payload(i).hex()}" for i in (5, 6, 7)
        ]
        raw = tmp_path / "ledger.bin"
        await pora_cli("ledger", "read", ledger_id, *common, "--raw", str(raw))
        assert raw.read_bytes() == b"".join(payload(i) for i in range(30))

        show = json.loads((await pora_cli("ledger", "show", ledger_id, *common, "--json")).stdout)
        assert show["state"] == "CLOSED"
        assert show["last_entry_id"] == show["last_add_confirmed"] == 29
        assert set(show["ensembles"][0]["addresses"]) == {node.address for node in nodes}
        text = (await pora_cli("ledger", "show", ledger_id, *common)).stdout.decode()
        assert "CLOSED" in text and "ensemble from 0" in text

        # once the killed node's lease ran out, `pora status` counts its copy missing
        with trio.fail_after(30):
            while (status := await cluster_status(url))["nodes"]["live"] != 2:  # noqa: ASYNC110 - no event crosses processes
                await trio.sleep(0.1)
        risk = status["under_replicated"]
        assert (risk["fragments"], risk["ledgers"], risk["missing_replicas"]) == (1, 1, 1)
        (fragment,) = risk["list"]
        assert fragment["ledger_id"] == ledger.ledger_id
        assert (fragment["first_entry_id"], fragment["last_entry_id"]) == (0, 29)
        assert fragment["missing"][0]["address"] == nodes[2].address
        assert fragment["copies_left"] == 2

        wrong = await pora_cli("ledger", "read", ledger_id, "--metadata", url, check=False)
        assert wrong.returncode == 2, wrong.stderr
        missing = await pora_cli("ledger", "show", "999", *common, check=False)
        assert missing.returncode == 2 and b"999" in missing.stderr
        both = await pora_cli(
            "ledger", "read", ledger_id, *common, "--data-dir", str(tmp_path / "a"), check=False
        )
        assert both.returncode == 2 and b"not both" in both.stderr


@pytest.mark.slow
async def test_tail_follows_appends_and_read_stops_at_the_lac(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as (url, _nodes), pora.connect(url) as client:
        ledger = await client.create_ledger(3, 3, 2, password=PASSWORD)
        for entry_id in range(5):
            await ledger.append(payload(entry_id))
        common = ("--metadata", url, "--password", PASSWORD)
        ledger_id = str(ledger.ledger_id)
        command = [sys.executable, "-m", "pora.cli", "ledger", "tail", ledger_id, *common]
        out = tmp_path / "tail.out"
        with out.open("wb") as tail_out:
            tail = await trio.lowlevel.open_process(
                [*command, "--from", "2", "--count", "8", "--json"], stdout=tail_out
            )
        try:
            for entry_id in range(5, 10):
                await ledger.append(payload(entry_id))
            # an open ledger read through the cluster stops at the LAC its nodes
            # confirm, and its writer is not fenced by it
            read = json_lines(
                (await pora_cli("ledger", "read", ledger_id, *common, "--json")).stdout
            )
            assert [e["entry_id"] for e in read] == list(range(len(read)))
            assert len(read) >= 9
            await ledger.append(payload(10))
            with trio.fail_after(30):
                assert await tail.wait() == 0
        finally:
            if tail.poll() is None:
                tail.kill()
                await tail.wait()
        assert [e["entry_id"] for e in json_lines(out.read_bytes())] == list(range(2, 10))
        await ledger.close()  # still its writer: nothing fenced it


@pytest.mark.slow
async def test_recover_closes_a_ledger_whose_writer_was_killed(tmp_path: Path) -> None:
    async with three_nodes(tmp_path) as (url, _nodes):
        log = tmp_path / "writer.log"
        writer = await trio.lowlevel.open_process(
            [sys.executable, str(WRITER_SCRIPT), url, str(log), "4"], env=os.environ
        )
        try:
            await wait_until(lambda: log.exists() and log.read_text().count("\nack ") >= 50, 30)
        finally:
            writer.send_signal(signal.SIGKILL)
            await writer.wait()
        lines = log.read_text().splitlines()
        ledger_id = lines[0].split()[1]
        acknowledged = {int(line.split()[1]) for line in lines if line.startswith("ack ")}
        common = ("--metadata", url, "--password", PASSWORD)

        before = json.loads((await pora_cli("ledger", "show", ledger_id, *common, "--json")).stdout)
        assert before["state"] == "OPEN"
        result = json.loads(
            (await pora_cli("ledger", "recover", ledger_id, *common, "--json")).stdout
        )
        assert result["state"] == "CLOSED"
        assert result["recovered"] is True
        assert result["last_entry_id"] >= max(acknowledged)
        text = (await pora_cli("ledger", "recover", ledger_id, *common)).stdout.decode()
        assert "CLOSED" in text  # a second recover finds it closed and says so
        again = json.loads(
            (await pora_cli("ledger", "recover", ledger_id, *common, "--json")).stdout
        )
        assert again["recovered"] is False
        assert again["last_entry_id"] == result["last_entry_id"]
        read = json_lines((await pora_cli("ledger", "read", ledger_id, *common, "--json")).stdout)
        assert [e["entry_id"] for e in read] == list(range(result["last_entry_id"] + 1))


def test_help_of_the_cluster_ledger_commands() -> None:
    for command in ("show", "read", "tail", "recover"):
        result = subprocess.run(
            [sys.executable, "-m", "pora.cli", "ledger", command, "--help"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert "--metadata" in result.stdout
