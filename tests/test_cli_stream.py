"""`pora stream`: refusals and the metadata-only commands in-process on a real SQLite
store; reading, tailing, sealing and deleting with the real `pora` command in
subprocesses against a real `pora cluster`."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from cli_support import CliResult, run_cli
from cluster_process import pora_cluster_process
from zookeeper_support import fresh_zk_url

import pora
from pora.meta import open_metadata

Capsys = pytest.CaptureFixture[str]
TIMEOUT_S = 60.0


@pytest.fixture(params=["sqlite", "zk"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty metadata store of either backend."""
    store = fresh_zk_url(request) if request.param == "zk" else f"sqlite:///{tmp_path}/meta.db"

    async def make() -> None:
        async with open_metadata(store):
            pass

    trio.run(make)
    return store


def test_create_list_show_delete_on_the_metadata_store(url: str, capsys: Capsys) -> None:
    created = run_cli(
        capsys, "stream", "create", "events", "--metadata", url,
        "--segment-bytes-max", "65536", "--ack-quorum", "3", "--retention-s", "60",
        "--txn-pending-max", "20",
    )  # fmt: skip
    assert created.status == 0, created.err
    assert "created stream 'events'" in created.out
    assert run_cli(capsys, "stream", "create", "audit", "--metadata", url).status == 0

    listing = run_cli(capsys, "stream", "list", "--metadata", url, "--json")
    assert listing.json() == {
        "streams": [
            {"name": "audit", "state": "ACTIVE", "commit": 0, "segments": 0, "writer_epoch": 0},
            {"name": "events", "state": "ACTIVE", "commit": 0, "segments": 0, "writer_epoch": 0},
        ]
    }
    table = run_cli(capsys, "stream", "list", "--metadata", url)
    assert table.out.splitlines()[0].split() == [
        "name", "state", "commit", "segments", "writer_epoch",
    ]  # fmt: skip
    assert table.out.splitlines()[2].split() == ["events", "ACTIVE", "0", "0", "0"]

    shown = run_cli(capsys, "stream", "show", "events", "--metadata", url, "--json").json()
    assert shown["config"] == {
        "ensemble_size": 3,
        "write_quorum": 3,
        "ack_quorum": 3,
        "segment_bytes_max": 65536,
        "segment_age_s_max": 3600,
        "retention_s": 60.0,
        "retention_bytes": None,
        "retention_s_max": None,
        "retention_bytes_max": None,
        "commit_keys_max": 10_000,
        "txn_idle_s_max": 86400.0,
        "txn_pending_max": 20,
        "txn_segments_max": 3000,
        "app_ids_max": 1000,
    }
    assert (shown["state"], shown["commit"], shown["segments"]) == ("ACTIVE", 0, [])
    # the document's sections this command does not know are shown as they are
    assert shown["transactions"] == [] and shown["cursors"] == []
    text = run_cli(capsys, "stream", "show", "events", "--metadata", url).out
    assert re.search(r"^config.segment_bytes_max +65536$", text, re.MULTILINE)
    assert "pending transactions: none" in text and "cursors: none" in text

    sealed = run_cli(capsys, "stream", "seal", "events", "--metadata", url)
    assert sealed.status == 0, sealed.err
    assert (
        run_cli(capsys, "stream", "show", "events", "--metadata", url, "--json").json()["state"]
        == "SEALED"
    )
    deleted = run_cli(capsys, "stream", "delete", "events", "--metadata", url)
    assert deleted.status == 0, deleted.err
    names = [s["name"] for s in run_cli(capsys, "stream", "list", "--metadata", url, "--json")
             .json()["streams"]]  # fmt: skip
    assert names == ["audit"]


def refused(result: CliResult, *words: str) -> None:
    assert result.status == 2, result
    assert result.out == ""
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pora: error: "), result.err
    for word in words:
        assert word in lines[0], result.err


def test_refusals_say_what_is_wrong_with_exit_status_2(
    url: str, tmp_path: Path, capsys: Capsys
) -> None:
    assert run_cli(capsys, "stream", "create", "events", "--metadata", url).status == 0
    refused(run_cli(capsys, "stream", "create", "events", "--metadata", url), "already exists")
    for command in ("show", "seal", "delete", "trim", "read", "tail"):
        refused(run_cli(capsys, "stream", command, "nope", "--metadata", url), "does not exist")
    refused(
        run_cli(capsys, "stream", "trim", "events", "--metadata", url, "--watch", "0"),
        "--watch must be",
    )
    refused(run_cli(capsys, "stream", "show", "bad/name", "--metadata", url), "not a stream name")
    refused(
        run_cli(capsys, "stream", "read", "events", "--metadata", url, "--from", "3-4"),
        "--from 3-4",
        "SEGMENT:ENTRY",
    )
    refused(run_cli(capsys, "stream", "read", "events", "--metadata", url, "--to", "x"), "--to x")
    refused(
        run_cli(capsys, "stream", "tail", "events", "--metadata", url, "--from=-1:0"),
        "--from -1:0",
    )
    refused(
        run_cli(capsys, "stream", "read", "events", "--metadata", url, "--json", "--raw", "f"),
        "--raw and --json",
    )
    refused(
        run_cli(
            capsys, "stream", "read", "events", "--metadata", url, "--raw", str(tmp_path / "no/f")
        ),
        "does not exist",
    )
    refused(run_cli(capsys, "stream", "tail", "events", "--metadata", url, "--count", "0"))
    refused(
        run_cli(capsys, "stream", "create", "x", "--metadata", url, "--segment-bytes-max", "10"),
        "segment_bytes_max",
    )
    refused(
        run_cli(capsys, "stream", "create", "x", "--metadata", url, "--ack-quorum", "4"),
    )
    refused(
        run_cli(capsys, "stream", "create", "x", "--metadata", url, "--app-ids-max", "9000"),
        "app_ids_max=9000",
        "lower some of them",
    )
    missing = f"sqlite:///{tmp_path}/missing.db"
    refused(run_cli(capsys, "stream", "list", "--metadata", missing))
    refused(run_cli(capsys, "stream", "create", "x", "--metadata", missing))
    refused(run_cli(capsys, "stream", "list", "--metadata", "nosuch://x"))


def test_help_of_every_command(capsys: Capsys) -> None:
    for command in ("list", "show", "create", "seal", "delete", "trim", "gc", "read", "tail"):
        with pytest.raises(SystemExit) as exit_:
            run_cli(capsys, "stream", command, "--help")
        assert exit_.value.code == 0
        assert "--metadata" in capsys.readouterr().out


# -- the real command against a real cluster ------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with pora_cluster_process(tmp_path_factory.mktemp("cluster"), nodes=3) as metadata:
        yield metadata


def pora_command(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pora.cli", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=os.environ,
    )


def payload(i: int) -> bytes:
    return f"entry {i} ".encode() * (1 + i % 3)


def append(url: str, name: str, payloads: list[bytes]) -> list[pora.Position]:
    """Append with a new live writer (a takeover: a new segment each call)."""

    async def main() -> list[pora.Position]:
        async with pora.connect(url) as client:
            stream = await client.open_stream(name)
            async with stream.open_writer() as writer:
                positions = await writer.append_many(payloads)
        return positions

    return trio.run(main)


@pytest.mark.slow
def test_read_show_seal_delete_against_a_cluster(cluster: str, tmp_path: Path) -> None:
    created = pora_command("stream", "create", "orders", "--metadata", cluster, "--json")
    assert created.returncode == 0, created.stderr
    first = append(cluster, "orders", [payload(i) for i in range(4)])
    second = append(cluster, "orders", [payload(i) for i in range(4, 7)])
    positions = first + second

    hexed = pora_command("stream", "read", "orders", "--metadata", cluster)
    assert hexed.returncode == 0, hexed.stderr
    assert hexed.stdout.splitlines() == [
        f"{p}\t{len(payload(i))}\t{payload(i).hex()}" for i, p in enumerate(positions)
    ]
    window = pora_command(
        "stream", "read", "orders", "--metadata", cluster, "--json",
        "--from", str(positions[2]), "--to", str(positions[5]),
    )  # fmt: skip

    lines = [json.loads(line) for line in window.stdout.splitlines()]
    assert [line["position"] for line in lines] == [str(p) for p in positions[2:5]]
    assert [base64.b64decode(line["payload_base64"]) for line in lines] == [
        payload(i) for i in range(2, 5)
    ]
    assert lines[0]["segment"] == positions[2].segment and lines[0]["size"] == len(payload(2))
    raw = tmp_path / "orders.bin"
    written = pora_command("stream", "read", "orders", "--metadata", cluster, "--raw", str(raw))
    assert written.returncode == 0, written.stderr
    assert raw.read_bytes() == b"".join(payload(i) for i in range(7))
    assert "wrote 7 entries" in written.stdout

    shown = json.loads(
        pora_command("stream", "show", "orders", "--metadata", cluster, "--json").stdout
    )
    assert shown["writer_epoch"] == 2 and shown["commit"] == 2
    rows = shown["segments"]
    assert [(r["seq"], r["state"], r["entries"]) for r in rows] == [
        (positions[0].segment, "CLOSED", 4),
        (positions[4].segment, "CLOSED", 3),
    ]
    assert rows[0]["bytes"] == sum(len(payload(i)) for i in range(4))

    sealed = pora_command("stream", "seal", "orders", "--metadata", cluster)
    assert sealed.returncode == 0, sealed.stderr
    deleted = pora_command("stream", "delete", "orders", "--metadata", cluster)
    assert deleted.returncode == 0, deleted.stderr
    gone = pora_command("stream", "read", "orders", "--metadata", cluster)
    assert gone.returncode == 2 and "does not exist" in gone.stderr


@pytest.mark.slow
def test_trim_applies_retention_by_size(cluster: str) -> None:
    kept = [payload(i) for i in range(4, 7)]
    created = pora_command(
        "stream", "create", "logs", "--metadata", cluster,
        "--retention-bytes", str(sum(len(p) for p in kept)),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    append(cluster, "logs", [payload(i) for i in range(4)])
    second = append(cluster, "logs", kept)
    trimmed = pora_command("stream", "trim", "logs", "--metadata", cluster, "--json")
    assert trimmed.returncode == 0, trimmed.stderr
    assert json.loads(trimmed.stdout) == {"first_held": {"logs": str(second[0])}}
    read = pora_command("stream", "read", "logs", "--metadata", cluster, "--json")
    assert [json.loads(line)["position"] for line in read.stdout.splitlines()] == [
        str(p) for p in second
    ]
    again = pora_command("stream", "trim", "--metadata", cluster)
    assert again.returncode == 0, again.stderr
    assert f"stream 'logs': first position held {second[0]}" in again.stdout


@pytest.mark.slow
def test_tail_follows_appends_across_writers(cluster: str) -> None:
    assert pora_command("stream", "create", "clicks", "--metadata", cluster).returncode == 0
    before = append(cluster, "clicks", [b"old"])
    tail = subprocess.Popen(
        [sys.executable, "-m", "pora.cli", "stream", "tail", "clicks", "--metadata", cluster,
         "--json", "--from", str(before[0]), "--count", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ,
    )  # fmt: skip
    try:
        assert tail.stdout is not None
        first = json.loads(tail.stdout.readline())  # the tail is reading: append live
        assert base64.b64decode(first["payload_base64"]) == b"old"
        later = append(cluster, "clicks", [b"a", b"b"]) + append(cluster, "clicks", [b"c", b"d"])
        out, err = tail.communicate(timeout=TIMEOUT_S)
    finally:
        tail.kill()
        tail.wait()
    assert tail.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["position"] for line in lines] == [str(p) for p in later]
    assert [base64.b64decode(line["payload_base64"]) for line in lines] == [
        b"a", b"b", b"c", b"d",
    ]  # fmt: skip
