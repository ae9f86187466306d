"""`pora status --metadata URL` on a real SQLite metadata store filled through the
store's API, and the under-replication rule it counts with: the audit's
(docs/rereplication.md A1..A3, A14), so that `pora status` and `pora audit` agree."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cli_support import run_cli
from test_cli_metadata_views import fill

from pora.cluster_ops.fragments import DRAINING, OTHER_INSTANCE, UNREGISTERED
from pora.cluster_ops.inventory import mark_draining
from pora.meta import MetadataStore, NodeRegistration
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata, LedgerState
from pora.streams.document_model import STREAMS_SPACE

Capsys = pytest.CaptureFixture[str]

A, B, C, D, E, F = (EnsembleMember(f"10.0.0.{k}:3181", f"inst-{k}") for k in range(1, 7))


def ledger_on(
    ledger_id: int, *ensembles: Ensemble, write_quorum: int = 3, **changes: object
) -> LedgerMetadata:
    meta = LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=len(ensembles[0].members),
        write_quorum=write_quorum,
        ack_quorum=2,
        ensembles=ensembles,
        password_digest=b"\x00digest",
        created_ms=1_700_000_000_000,
    )
    return replace(meta, **changes)  # type: ignore[arg-type]


def live(*members: EnsembleMember) -> dict[str, NodeRegistration]:
    return {m.address: NodeRegistration(m.address, m.instance_id) for m in members}


def test_status_counts_what_the_audit_lists_on_the_same_cluster(
    tmp_path: Path, capsys: Capsys
) -> None:
    """One rule (docs/rereplication.md A1..A3, A14): every kind of lost member, an open
    tail, an empty tail and write sets of several widths, counted by `pora status` and
    listed by `pora audit`, member for member."""
    url = f"sqlite:///{tmp_path}/meta.db"
    # A, E, F healthy; B draining; C's data dir wiped; D not registered
    ledgers = [
        ledger_on(  # 10-19 on C's old instance
            1, Ensemble(0, (A, E, F)), Ensemble(10, (A, E, C)), state=LedgerState.CLOSED,
            last_entry_id=19,
        ),
        ledger_on(2, Ensemble(0, (A, E, D))),  # an open tail on D
        ledger_on(  # A3: the tail on D covers no entry
            3, Ensemble(0, (A, E, F)), Ensemble(5, (A, E, D)), state=LedgerState.CLOSED,
            last_entry_id=4,
        ),
        # E=4 Qw=2: C and D are in no write set together; B and D share entry 1's
        ledger_on(4, Ensemble(0, (A, C, E, D)), write_quorum=2),
        ledger_on(5, Ensemble(0, (A, B, D, E)), write_quorum=2),
        # one entry, written to D and A only: one copy left, whatever C holds
        ledger_on(
            6, Ensemble(0, (D, A, C)), write_quorum=2, state=LedgerState.CLOSED,
            last_entry_id=0,
        ),
    ]  # fmt: skip

    async def body(store: MetadataStore) -> None:
        for member in (A, B, E, F):
            await store.register_node(NodeRegistration(member.address, member.instance_id), 60)
        await store.register_node(NodeRegistration(C.address, "inst-wiped"), 60)
        await mark_draining(store, B.address, "test", 0)
        for meta in ledgers:
            await store.create_ledger(meta)

    fill(url, body)
    audit = run_cli(capsys, "audit", "--metadata", url, "--json")
    assert audit.status == 1, audit.err
    findings = audit.json()["under_replicated"]
    status = run_cli(capsys, "status", "--metadata", url, "--json", "--show", "100")
    assert status.status == 0, status.err
    risk = status.json()["under_replicated"]

    listed_by_audit = sorted(
        (f["ledger"], f["fragment"]["first_entry"], f["fragment"]["last_entry"], f["node"],
         f["instance_id"], f["why"], f["copies_left"])
        for f in findings
    )  # fmt: skip
    counted_by_status = sorted(
        (f["ledger_id"], f["first_entry_id"], f["last_entry_id"], m["address"],
         m["instance_id"], m["why"], f["copies_left"])
        for f in risk["list"]
        for m in f["missing"]
    )  # fmt: skip
    assert counted_by_status == listed_by_audit
    assert listed_by_audit == [
        (1, 10, 19, C.address, C.instance_id, OTHER_INSTANCE, 2),
        (2, 0, None, D.address, D.instance_id, UNREGISTERED, 2),
        (4, 0, None, C.address, C.instance_id, OTHER_INSTANCE, 1),
        (4, 0, None, D.address, D.instance_id, UNREGISTERED, 1),
        (5, 0, None, B.address, B.instance_id, DRAINING, 0),
        (5, 0, None, D.address, D.instance_id, UNREGISTERED, 0),
        (6, 0, 0, C.address, C.instance_id, OTHER_INSTANCE, 1),
        (6, 0, 0, D.address, D.instance_id, UNREGISTERED, 1),
    ]
    fragments = {(f["ledger"], f["fragment"]["first_entry"]) for f in findings}
    assert (risk["fragments"], risk["ledgers"], risk["missing_replicas"], risk["more"]) == (
        len(fragments), len({ledger for ledger, _ in fragments}), len(findings), False,
    )  # fmt: skip

    nodes = status.json()["nodes"]
    assert nodes["draining"] == 1
    assert {n["address"]: n["draining"] for n in nodes["list"]} == {
        A.address: False, B.address: True, C.address: False, E.address: False,
        F.address: False,
    }  # fmt: skip
    text = run_cli(capsys, "status", "--metadata", url)
    assert "5 live: 5 writable, 0 read-only, 1 draining" in text.out
    assert f"{B.address} (draining)" in text.out


def test_status_sums_nodes_ledgers_streams_and_fragments_at_risk(
    tmp_path: Path, capsys: Capsys
) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"

    async def body(store: MetadataStore) -> None:
        await store.register_node(NodeRegistration(A.address, A.instance_id, free_bytes=2**30), 60)
        await store.register_node(
            NodeRegistration(B.address, B.instance_id, read_only=True, free_bytes=2**20), 60
        )
        await store.register_node(NodeRegistration(C.address, "inst-wiped"), 60)
        ensemble = Ensemble(0, (A, B, C))
        for ledger_id in range(3):  # closed, 100 bytes each, C's copy wiped
            await store.create_ledger(
                ledger_on(
                    ledger_id, ensemble, state=LedgerState.CLOSED, last_entry_id=9, length=100
                )
            )
        await store.create_ledger(ledger_on(3, ensemble))  # open
        await store.create_ledger(  # closed empty: nothing at risk
            ledger_on(4, ensemble, state=LedgerState.CLOSED, last_entry_id=-1)
        )
        await store.create_document(STREAMS_SPACE, "events", b"{}")

    fill(url, body)
    result = run_cli(capsys, "status", "--metadata", url, "--json", "--show", "2")
    assert result.status == 0, result.err
    doc = result.json()
    assert doc["nodes"]["live"] == 3
    assert (doc["nodes"]["writable"], doc["nodes"]["read_only"]) == (2, 1)
    assert doc["nodes"]["free_bytes"] == 2**30 + 2**20
    assert doc["nodes"]["draining"] == 0
    assert [node["draining"] for node in doc["nodes"]["list"]] == [False] * 3
    assert doc["ledgers"] == {
        "total": 5, "open": 1, "in_recovery": 0, "closed": 4, "closed_bytes": 300,
    }  # fmt: skip
    assert doc["streams"] == 1
    risk = doc["under_replicated"]
    assert (risk["fragments"], risk["ledgers"], risk["missing_replicas"]) == (4, 4, 4)
    assert [f["ledger_id"] for f in risk["list"]] == [0, 1] and risk["more"] is True
    assert risk["list"][0]["missing"] == [
        {"address": C.address, "instance_id": C.instance_id, "why": OTHER_INSTANCE}
    ]

    text = run_cli(capsys, "status", "--metadata", url)
    assert text.status == 0, text.err
    assert "3 live: 2 writable, 1 read-only" in text.out
    assert "4 fragment(s) of 4 ledger(s)" in text.out and "pora rereplicate" in text.out
    assert text.out.count(C.address) == 5  # its node row and the four fragments'
    assert "more (--show N)" not in text.out


def test_status_refuses_an_unreachable_store(tmp_path: Path, capsys: Capsys) -> None:
    result = run_cli(capsys, "status", "--metadata", f"sqlite:///{tmp_path}/none.db")
    assert result.status == 2
    assert run_cli(capsys, "status", "--metadata", "x", "--show", "-1").status == 2
