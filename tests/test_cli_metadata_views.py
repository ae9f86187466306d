"""`pora nodes` and `pora ledger list --metadata` on real SQLite metadata stores, filled
through the store's API."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
from cli_support import run_cli
from test_meta_store import ledger

from pora.meta import MetadataStore, NodeRegistration, open_metadata

Capsys = pytest.CaptureFixture[str]


def fill(url: str, body: Callable[[MetadataStore], Awaitable[None]]) -> None:
    async def main() -> None:
        async with open_metadata(url) as store:
            await body(store)

    trio.run(main)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/meta.db"


def register_three(url: str) -> None:
    async def body(store: MetadataStore) -> None:
        await store.register_node(
            NodeRegistration("10.0.0.2:3181", "inst-b", free_bytes=5 * 2**30, rack="r2"), 60
        )
        await store.register_node(
            NodeRegistration("10.0.0.1:3181", "inst-a", free_bytes=1536, rack="r1"), 60
        )
        await store.register_node(
            NodeRegistration("10.0.0.3:3181", "inst-c", read_only=True, free_bytes=0), 60
        )
        # an expired lease counts as gone
        await store.register_node(NodeRegistration("10.0.0.4:3181", "inst-d"), 0.001)

    fill(url, body)


def test_nodes_lists_live_registrations(url: str, capsys: Capsys) -> None:
    register_three(url)
    result = run_cli(capsys, "nodes", "--metadata", url, "--json")
    assert result.status == 0, result.err
    doc = result.json()
    assert doc["metadata"] == url
    nodes = doc["nodes"]
    assert [n["address"] for n in nodes] == ["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"]
    assert nodes[0] == {
        "address": "10.0.0.1:3181",
        "state": "writable",
        "free_bytes": 1536,
        "rack": "r1",
        "last_seen_ms": nodes[0]["last_seen_ms"],
        "last_seen_ago_s": nodes[0]["last_seen_ago_s"],
        "instance_id": "inst-a",
    }
    assert 0 <= nodes[0]["last_seen_ago_s"] < 60
    assert nodes[2]["state"] == "read-only" and nodes[2]["rack"] is None

    table = run_cli(capsys, "nodes", "--metadata", url)
    assert table.status == 0
    header, *lines = table.out.splitlines()
    assert header.split() == ["address", "state", "free", "rack", "last_seen", "instance_id"]
    assert len(lines) == 3
    assert "1.5 KiB" in lines[0] and "r1" in lines[0] and "s ago" in lines[0]
    assert "5.0 GiB" in lines[1]

    writable = run_cli(capsys, "nodes", "--metadata", url, "--writable-only", "--json")
    assert [n["address"] for n in writable.json()["nodes"]] == ["10.0.0.1:3181", "10.0.0.2:3181"]


def test_nodes_says_when_there_are_none(url: str, capsys: Capsys) -> None:
    fill(url, lambda store: store.list_nodes())  # type: ignore[arg-type, return-value]
    result = run_cli(capsys, "nodes", "--metadata", url)
    assert result.status == 0
    assert "no live nodes registered" in result.out
    assert run_cli(capsys, "nodes", "--metadata", url, "--json").json()["nodes"] == []


def test_an_unreachable_store_exits_2_with_its_message(tmp_path: Path, capsys: Capsys) -> None:
    url = f"sqlite:///{tmp_path}/missing-folder/meta.db"
    for argv in (["nodes"], ["ledger", "list"]):
        result = run_cli(capsys, *argv, "--metadata", url)
        assert result.status == 2
        assert url in result.err and "unavailable" in result.err


def create_ledgers(url: str, count: int) -> None:
    async def body(store: MetadataStore) -> None:
        for _ in range(count):
            created = await store.create_ledger(ledger(await store.allocate_ledger_id()))
            if created.value.ledger_id == 1:
                await store.update_ledger(created.value.closed(41, 4200), created.version)

    fill(url, body)


def test_ledger_list_from_metadata(url: str, capsys: Capsys) -> None:
    create_ledgers(url, 3)
    result = run_cli(capsys, "ledger", "list", "--metadata", url, "--json")
    assert result.status == 0, result.err
    doc = result.json()
    assert doc["metadata"] == url and doc["next_after"] is None
    rows = doc["ledgers"]
    assert [row["ledger_id"] for row in rows] == [0, 1, 2]
    assert rows[1] == {
        "ledger_id": 1,
        "version": 1,
        "state": "CLOSED",
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "ensembles": 1,
        "current_ensemble": {
            "first_entry_id": 0,
            "addresses": ["127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183"],
        },
        "last_entry_id": 41,
        "length": 4200,
        "created_ms": 1_700_000_000_000,
    }
    table = run_cli(capsys, "ledger", "list", "--metadata", url)
    header, *lines = table.out.splitlines()
    assert header.split()[:3] == ["ledger_id", "state", "E/Qw/Qa"]
    assert lines[1].split() == [
        "1",
        "CLOSED",
        "3/2/2",
        "1",
        "127.0.0.1:3181,127.0.0.1:3182,127.0.0.1:3183",
        "41",
        "4200",
    ]


def test_ledger_list_pages_with_limit_and_after(
    url: str, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pora.cli._ledger_metadata as listing  # noqa: PLC0415

    monkeypatch.setattr(listing, "PAGE_SIZE", 4)  # several pages from a few ledgers
    create_ledgers(url, 11)
    whole = run_cli(capsys, "ledger", "list", "--metadata", url, "--json").json()
    assert [row["ledger_id"] for row in whole["ledgers"]] == list(range(11))
    first = run_cli(capsys, "ledger", "list", "--metadata", url, "--limit", "6", "--json")
    assert [row["ledger_id"] for row in first.json()["ledgers"]] == list(range(6))
    assert first.json()["next_after"] == 5
    rest = run_cli(
        capsys, "ledger", "list", "--metadata", url, "--after", "5", "--limit", "5", "--json"
    )
    assert [row["ledger_id"] for row in rest.json()["ledgers"]] == list(range(6, 11))
    assert rest.json()["next_after"] is None  # exactly the last ledger: nothing more
    table = run_cli(capsys, "ledger", "list", "--metadata", url, "--limit", "6")
    assert len(table.out.splitlines()) == 7
    assert "continue with --after 5" in table.err
    empty = run_cli(capsys, "ledger", "list", "--metadata", url, "--after", "10")
    assert empty.status == 0 and "no ledgers" in empty.out


def test_ledger_list_sources_exclude_each_other(url: str, tmp_path: Path, capsys: Capsys) -> None:
    both = run_cli(capsys, "ledger", "list", "--metadata", url, "--data-dir", str(tmp_path))
    assert both.status == 2 and "not both" in both.err
    paging = run_cli(capsys, "ledger", "list", "--data-dir", str(tmp_path), "--limit", "3")
    assert paging.status == 2 and "--limit and --after page through --metadata" in paging.err
    bad = run_cli(capsys, "ledger", "list", "--metadata", url, "--limit", "0")
    assert bad.status == 2
