"""The replicating client's entry format and placement (R1, R2): pure functions,
tested directly and with hypothesis."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pora
from pora.client.replication.core.entry_format import (
    HEADER_BYTES,
    decode_entry,
    encode_entry,
    payload_bytes_max,
)
from pora.client.replication.core.placement import choose_ensemble, choose_replacements, quarantined
from pora.client.replication.errors import EntryDamaged, NotEnoughNodes
from pora.meta.records import EnsembleMember, NodeRegistration


def node(
    i: int, rack: str | None = None, free: int = 0, read_only: bool = False
) -> NodeRegistration:
    return NodeRegistration(f"10.0.0.{i}:3181", f"inst-{i}", read_only, free, rack)


# -- entry format ---------------------------------------------------------------------


@given(
    ledger_id=st.integers(0, 2**63 - 1),
    entry_id=st.integers(0, 2**63 - 1),
    payload=st.binary(max_size=64),
    before=st.integers(0, 2**40),
)
def test_an_encoded_entry_decodes_to_itself(
    ledger_id: int, entry_id: int, payload: bytes, before: int
) -> None:
    data = encode_entry(ledger_id, entry_id, before + len(payload), payload)
    assert len(data) == HEADER_BYTES + len(payload)
    entry = decode_entry(ledger_id, entry_id, data)
    assert (entry.payload, entry.length_after) == (payload, before + len(payload))


@given(payload=st.binary(min_size=1, max_size=32), data=st.data())
def test_any_flipped_bit_is_reported_as_damage_naming_ledger_and_entry(
    payload: bytes, data: st.DataObject
) -> None:
    encoded = bytearray(encode_entry(7, 9, 100, payload))
    bit = data.draw(st.integers(0, len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(EntryDamaged) as caught:
        decode_entry(7, 9, bytes(encoded))
    assert (caught.value.ledger_id, caught.value.entry_id) == (7, 9)
    assert "entry 9 of ledger 7" in str(caught.value)


def test_an_entry_read_under_another_id_is_damaged() -> None:
    encoded = encode_entry(7, 9, 3, b"abc")
    with pytest.raises(EntryDamaged, match="crc"):
        decode_entry(7, 10, encoded)
    with pytest.raises(EntryDamaged, match="crc"):
        decode_entry(8, 9, encoded)


def test_short_bytes_and_an_unknown_format_are_damage() -> None:
    with pytest.raises(EntryDamaged, match="shorter than the 13-byte header"):
        decode_entry(1, 2, b"\x01\x00")
    encoded = bytearray(encode_entry(1, 2, 3, b"abc"))
    encoded[0] = 2
    with pytest.raises(EntryDamaged, match="format 2"):
        decode_entry(1, 2, bytes(encoded))
    assert isinstance(EntryDamaged(1, 2, "x"), pora.PoraError)


def test_payload_limit_is_the_node_entry_limit_less_the_header() -> None:
    assert payload_bytes_max(4 << 20) == (4 << 20) - 13
    encode_entry(1, 0, 13, b"x" * 13, payload_limit=13)
    with pytest.raises(ValueError, match="exceeds the 12 bytes"):
        encode_entry(1, 0, 13, b"x" * 13, payload_limit=12)
    with pytest.raises(ValueError, match="length_after"):
        encode_entry(1, 0, 2, b"abc")


# -- placement -------------------------------------------------------------------------


def test_r1_members_come_from_distinct_racks_when_there_are_enough() -> None:
    nodes = [node(i, rack=f"r{i % 4}", free=1000 - i) for i in range(12)]
    for seed in range(20):
        members = choose_ensemble(nodes, 4, random.Random(seed))
        racks = {n.address: n.rack for n in nodes}
        assert len({racks[m.address] for m in members}) == 4


def test_r1_fewer_racks_than_members_spread_evenly() -> None:
    nodes = [node(i, rack=f"r{i % 2}") for i in range(8)]
    racks = {n.address: n.rack for n in nodes}
    members = choose_ensemble(nodes, 5, random.Random(1))
    assert sorted(Counter(racks[m.address] for m in members).values()) == [2, 3]


def test_r1_more_free_bytes_first_and_never_a_read_only_node() -> None:
    nodes = [node(1, free=10), node(2, free=30, read_only=True), node(3, free=20), node(4)]
    members = choose_ensemble(nodes, 2, random.Random(0))
    assert [m.address for m in members] == ["10.0.0.3:3181", "10.0.0.1:3181"]


def test_r1_ties_are_broken_by_the_random_passed_in_and_replay_with_its_seed() -> None:
    nodes = [node(i) for i in range(10)]
    choices = {choose_ensemble(nodes, 3, random.Random(seed)) for seed in range(30)}
    assert len(choices) > 1
    assert choose_ensemble(nodes, 3, random.Random(5)) == choose_ensemble(
        list(reversed(nodes)), 3, random.Random(5)
    )


def test_r2_members_record_address_and_instance_id() -> None:
    (member,) = choose_ensemble([node(1)], 1, random.Random(0))
    assert member == EnsembleMember("10.0.0.1:3181", "inst-1")


def test_r2_not_enough_nodes_says_found_and_needed() -> None:
    nodes = [node(1), node(2), node(3, read_only=True)]
    with pytest.raises(pora.NotEnoughNodes) as caught:
        choose_ensemble(nodes, 3, random.Random(0))
    assert (caught.value.found, caught.value.needed) == (2, 3)
    assert "needs 3 writable live node(s) but found 2" in str(caught.value)


def test_r9_a_replacement_is_never_a_member_nor_an_excluded_node_and_prefers_a_free_rack() -> None:
    nodes = [node(i, rack=f"r{i}") for i in range(1, 4)] + [
        node(4, rack="r1", free=99),
        node(5, rack="r9"),
        node(6, rack="r8", free=50),
    ]
    ensemble = choose_ensemble(nodes[:3], 3, random.Random(0))
    failed = ensemble[1]
    chosen = choose_replacements(
        nodes,
        ensemble,
        [failed],
        random.Random(0),
        excluded=[EnsembleMember("10.0.0.6:3181", "inst-6")],
    )
    # node 4 has the most free bytes but shares r1 with a survivor; node 6 is excluded
    assert chosen == {failed: EnsembleMember("10.0.0.5:3181", "inst-5")}


def test_r12_no_replacement_is_not_enough_nodes_counting_the_excluded() -> None:
    nodes = [node(i) for i in range(1, 4)]
    ensemble = choose_ensemble(nodes, 3, random.Random(0))
    with pytest.raises(NotEnoughNodes) as caught:
        choose_replacements(
            nodes, ensemble, [ensemble[0]], random.Random(0), excluded=[ensemble[0]]
        )
    assert (caught.value.found, caught.value.needed, caught.value.excluded) == (0, 1, 3)
    assert "besides 3 excluded" in str(caught.value)


def test_r9_a_failed_member_out_of_quarantine_takes_its_own_position_back_last() -> None:
    """Three nodes, E=3: once its quarantine ended, the failed member (still
    registered, same instance) is its own replacement; a node outside the ensemble
    is taken before it, and it never moves to another failed member's position."""
    nodes = [node(i) for i in range(1, 5)]
    ensemble = choose_ensemble(nodes[:3], 3, random.Random(0))
    failed = ensemble[0]
    assert choose_replacements(nodes[:3], ensemble, [failed], random.Random(0)) == {failed: failed}
    spare = EnsembleMember(nodes[3].address, nodes[3].instance_id)
    assert choose_replacements(nodes, ensemble, [failed], random.Random(0)) == {failed: spare}
    # two failed, one spare: the spare takes the first position, the second comes back
    two = choose_replacements(nodes, ensemble, [ensemble[0], ensemble[1]], random.Random(0))
    assert two == {ensemble[0]: spare, ensemble[1]: ensemble[1]}
    # gone from the registrations: it cannot come back
    registered = [n for n in nodes[:3] if n.address != failed.address]
    with pytest.raises(NotEnoughNodes):
        choose_replacements(registered, ensemble, [failed], random.Random(0))


def test_r9_a_new_instance_at_a_failed_members_address_may_replace_it() -> None:
    """A wiped node back at its address (another instance id) is a new node; the
    failed instance itself, and the surviving members' addresses, never are."""
    nodes = [node(i) for i in range(1, 4)]
    ensemble = choose_ensemble(nodes, 3, random.Random(0))
    failed = ensemble[2]
    wiped = NodeRegistration(failed.address, "inst-new", False, 0, None)
    renewed = [nodes[0], nodes[1], wiped]
    chosen = choose_replacements(renewed, ensemble, [failed], random.Random(0))
    assert chosen == {failed: EnsembleMember(failed.address, "inst-new")}
    # an instance that failed before for this ledger stays excluded
    with pytest.raises(NotEnoughNodes):
        choose_replacements(
            renewed,
            ensemble,
            [failed],
            random.Random(0),
            excluded=[EnsembleMember(failed.address, "inst-new")],
        )


def test_r9_nodes_that_never_failed_for_the_ledger_are_preferred() -> None:
    base = [node(i) for i in range(1, 4)]
    ensemble = choose_ensemble(base, 3, random.Random(0))
    failed = ensemble[0]
    wiped = NodeRegistration(failed.address, "inst-new", False, 10**9, None)
    others = [n for n in base if n.address != failed.address]
    for seed in range(20):
        chosen = choose_replacements(
            [*others, wiped, node(4), node(5)], ensemble, [failed], random.Random(seed)
        )
        assert chosen[failed].address in {"10.0.0.4:3181", "10.0.0.5:3181"}
    # two failed and one fresh node: the fresh one and the new instance
    two = choose_replacements(
        [*others, wiped, node(4)], ensemble, [ensemble[0], ensemble[1]], random.Random(0)
    )
    assert set(two.values()) == {
        EnsembleMember("10.0.0.4:3181", "inst-4"),
        EnsembleMember(failed.address, "inst-new"),
    }


def test_r9_a_failed_member_is_excluded_for_its_quarantine_then_a_candidate_again() -> None:
    """The time is the caller's (the client's monotonic clock): placement reads none."""
    nodes = [node(i) for i in range(1, 5)]
    ensemble = choose_ensemble(nodes[:3], 3, random.Random(0))
    earlier = EnsembleMember(nodes[3].address, nodes[3].instance_id)  # failed before
    failing = ensemble[0]
    failed_at = {earlier: 100.0, failing: 109.5}  # the writer quarantines each failure
    young = quarantined(failed_at, now=109.9, quarantine_s=10.0)
    assert young == failed_at
    with pytest.raises(NotEnoughNodes):
        choose_replacements(nodes, ensemble, [failing], random.Random(0), excluded=young)
    expired = quarantined(failed_at, now=110.0, quarantine_s=10.0)
    assert expired == {failing: 109.5}
    chosen = choose_replacements(nodes, ensemble, [failing], random.Random(0), excluded=expired)
    assert chosen == {failing: earlier}


@given(
    racks=st.lists(st.sampled_from(["a", "b", "c", None]), min_size=1, max_size=12),
    size=st.integers(1, 12),
    seed=st.integers(0, 1000),
)
def test_r1_an_ensemble_is_distinct_writable_nodes_spread_over_racks(
    racks: list[str | None], size: int, seed: int
) -> None:
    nodes = [node(i, rack=rack, read_only=i % 5 == 4) for i, rack in enumerate(racks)]
    writable = [n for n in nodes if not n.read_only]
    if len(writable) < size:
        with pytest.raises(NotEnoughNodes):
            choose_ensemble(nodes, size, random.Random(seed))
        return
    members = choose_ensemble(nodes, size, random.Random(seed))
    assert len({m.address for m in members}) == size
    by_address = {n.address: n for n in writable}
    assert all(m.address in by_address for m in members)
    # as even as the racks allow: a rack holds more than another only when the
    # other has no node left
    use = Counter(by_address[m.address].rack or "" for m in members)
    available = Counter(n.rack or "" for n in writable)
    for count in use.values():
        for other in available:
            if use[other] < count - 1:
                assert use[other] == available[other]
