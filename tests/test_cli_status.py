"""`pora status --metadata URL` on a real SQLite metadata store filled through the
store's API, and the under-replication rule it counts with: a fragment's member is
missing when no node is registered at its address or one with another instance id."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from cli_support import run_cli
from test_cli_metadata_views import fill

from pora.cli._cluster_health import under_replicated
from pora.meta import MetadataStore, NodeRegistration
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata, LedgerState
from pora.streams.document_model import STREAMS_SPACE

Capsys = pytest.CaptureFixture[str]

A, B, C, D = (EnsembleMember(f"10.0.0.{k}:3181", f"inst-{k}") for k in range(1, 5))


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


def test_a_fragment_is_under_replicated_when_a_member_is_gone_or_another_instance() -> None:
    closed = ledger_on(
        1,
        Ensemble(0, (A, B, C)),
        Ensemble(10, (A, B, D)),
        state=LedgerState.CLOSED,
        last_entry_id=19,
        length=100,
    )
    assert under_replicated(closed, live(A, B, C, D)) == []
    # C is gone: only the first fragment (0-9) held anything on it
    (fragment,) = under_replicated(closed, live(A, B, D))
    assert (fragment.first_entry_id, fragment.last_entry_id) == (0, 9)
    assert fragment.missing == (C,) and fragment.copies_left == 2
    # D's address answers with another instance id: a wiped data dir
    wiped = {**live(A, B, C), D.address: NodeRegistration(D.address, "inst-new")}
    (fragment,) = under_replicated(closed, wiped)
    assert (fragment.first_entry_id, fragment.last_entry_id, fragment.missing) == (10, 19, (D,))
    # an open ledger's last fragment is at risk too, with no end yet
    (fragment,) = under_replicated(ledger_on(2, Ensemble(0, (A, B, C))), live(A, B))
    assert fragment.last_entry_id is None
    # a closed ledger's last ensemble that covers no entry holds nothing at risk
    empty_tail = ledger_on(
        3, Ensemble(0, (A, B, C)), Ensemble(5, (A, B, D)), state=LedgerState.CLOSED,
        last_entry_id=4,
    )  # fmt: skip
    assert under_replicated(empty_tail, live(A, B, C)) == []


def test_copies_left_counts_the_worst_write_set() -> None:
    # E=4 Qw=2: write sets are neighbours; A and C missing are never in one set
    striped = ledger_on(1, Ensemble(0, (A, B, C, D)), write_quorum=2)
    (fragment,) = under_replicated(striped, live(B, D))
    assert fragment.copies_left == 1
    (fragment,) = under_replicated(striped, live(C, D))  # A and B share entry 0's set
    assert fragment.copies_left == 0


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
    assert doc["nodes"]["draining"] is None  # registrations carry no mark here
    assert doc["ledgers"] == {
        "total": 5, "open": 1, "in_recovery": 0, "closed": 4, "closed_bytes": 300,
    }  # fmt: skip
    assert doc["streams"] == 1
    risk = doc["under_replicated"]
    assert (risk["fragments"], risk["ledgers"], risk["missing_replicas"]) == (4, 4, 4)
    assert [f["ledger_id"] for f in risk["list"]] == [0, 1] and risk["more"] is True
    assert risk["list"][0]["missing"] == [{"address": C.address, "instance_id": C.instance_id}]

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
