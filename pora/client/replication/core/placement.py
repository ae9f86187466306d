"""Placement (R1, R2): which registered nodes hold a new ensemble, and which node
replaces a failed member.

Deterministic given its inputs: the caller passes the registrations (the store's
`list_nodes(writable_only=True)`, live ones only) and a `random.Random`, so a seeded
simulation replays the same choices.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

from pora.client.replication.errors import NotEnoughNodes
from pora.meta.records import EnsembleMember, NodeRegistration

#: the rack of a registration that carries no label: all such nodes count as one rack
UNLABELLED = ""


def choose_ensemble(
    nodes: Iterable[NodeRegistration], size: int, rng: random.Random
) -> tuple[EnsembleMember, ...]:
    """R1/R2: `size` distinct writable nodes, spread over racks (distinct racks when
    there are enough, else as evenly as the racks allow), more free bytes first, ties
    broken by `rng`. NotEnoughNodes when fewer than `size` qualify."""
    if size < 1:
        raise ValueError(f"an ensemble has at least one node, not {size}")
    candidates = _candidates(nodes, excluded=())
    if len(candidates) < size:
        raise NotEnoughNodes(len(candidates), size)
    return _pick(candidates, size, rng, Counter())


def choose_replacements(
    nodes: Iterable[NodeRegistration],
    ensemble: Sequence[EnsembleMember],
    failed: Collection[EnsembleMember],
    rng: random.Random,
    excluded: Collection[EnsembleMember] = (),
) -> dict[EnsembleMember, EnsembleMember]:
    """R9: a replacement for each failed member of `ensemble`. Never at a surviving
    member's address, never a member still in quarantine (`excluded`: the members
    that failed for this ledger lately, see `quarantined`). A registration at a failed
    member's address with another instance id is a new node (a wiped data dir) and may
    replace it; nodes at addresses that did not fail for this ledger are taken first,
    then nodes whose quarantine ended, and last a failed member whose quarantine ended
    takes its own position back (a slow or cut-off node that came back, on a cluster
    with no other candidate). A failed member never moves to another position.
    Replacements favour racks the surviving members do not use. NotEnoughNodes when
    too few remain."""
    failed_set = set(failed)
    unknown = failed_set.difference(ensemble)
    if unknown:
        raise ValueError(f"members {sorted(m.address for m in unknown)} are not in the ensemble")
    surviving = [member for member in ensemble if member not in failed_set]
    taken = {member.address for member in surviving}
    quarantine = set(excluded)
    refused = failed_set | quarantine
    registered = list(nodes)
    racks = {node.address: node.rack or UNLABELLED for node in registered}
    writable = _candidates(registered, excluded=taken)
    candidates = [
        node for node in writable if EnsembleMember(node.address, node.instance_id) not in refused
    ]
    live = {EnsembleMember(node.address, node.instance_id) for node in writable}
    in_order = [member for member in ensemble if member in failed_set]
    # a failed member out of quarantine and registered again (same instance) may
    # take its own position back, when nothing else is left
    returning = [m for m in in_order if m not in quarantine and m in live]
    if len(candidates) + len(returning) < len(failed_set):
        everyone = len(_candidates(registered, excluded=()))
        available = len(candidates) + len(returning)
        raise NotEnoughNodes(available, len(failed_set), excluded=everyone - available)
    rack_use = Counter(racks.get(member.address, UNLABELLED) for member in surviving)
    failed_addresses = {member.address for member in refused}
    fresh = [node for node in candidates if node.address not in failed_addresses]
    renewed = [node for node in candidates if node.address in failed_addresses]
    need = len(failed_set)
    chosen = _pick(fresh, min(len(fresh), need), rng, rack_use)
    rack_use.update(racks.get(member.address, UNLABELLED) for member in chosen)
    chosen += _pick(renewed, min(len(renewed), need - len(chosen)), rng, rack_use)
    # the members that return to their own positions: the last ones of `returning`,
    # so that the others are replaced in the ensemble's order
    back = returning[len(returning) - (need - len(chosen)) :] if need > len(chosen) else []
    moved = [member for member in in_order if member not in back]
    replacements = dict(zip(moved, chosen, strict=True))
    replacements.update({member: member for member in back})
    return replacements


def quarantined(
    failed_at: Mapping[EnsembleMember, float], now: float, quarantine_s: float
) -> dict[EnsembleMember, float]:
    """R9: the members of `failed_at` (member -> when it failed for the ledger, on the
    caller's monotonic clock) still in quarantine at `now`: those that failed less than
    `quarantine_s` ago. The others may be chosen again: a node cut off for a moment is
    not lost for the ledger's lifetime, and the map stays as small as the failures of
    one quarantine period."""
    return {member: when for member, when in failed_at.items() if now - when < quarantine_s}


def _candidates(
    nodes: Iterable[NodeRegistration], excluded: Collection[str]
) -> list[NodeRegistration]:
    """Writable registrations by address, each address once, sorted so the input's
    order never changes the choice."""
    by_address: dict[str, NodeRegistration] = {}
    for node in nodes:
        if not node.read_only and node.address not in excluded:
            by_address[node.address] = node
    return [by_address[address] for address in sorted(by_address)]


def _pick(
    candidates: list[NodeRegistration],
    count: int,
    rng: random.Random,
    rack_use: Counter[str],
) -> tuple[EnsembleMember, ...]:
    """Greedy: each turn takes, from the racks used least so far, the node with the most
    free bytes (ties at random). Taking the least-used rack first gives distinct racks
    while unused ones remain and an even spread after."""
    tiebreak = {node.address: rng.random() for node in candidates}
    left = list(candidates)
    rack_use = Counter(rack_use)
    chosen: list[EnsembleMember] = []
    for _ in range(count):
        best = min(
            left,
            key=lambda n: (rack_use[n.rack or UNLABELLED], -n.free_bytes, tiebreak[n.address]),
        )
        left.remove(best)
        rack_use[best.rack or UNLABELLED] += 1
        chosen.append(EnsembleMember(best.address, best.instance_id))
    return tuple(chosen)
