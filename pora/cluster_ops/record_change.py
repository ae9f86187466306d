"""A7..A9: a repaired fragment's members replaced in the ledger record, by
compare-and-set, re-read and re-applied on a conflict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pora.meta.errors import MetadataTimeout, MetadataVersionConflict, NoSuchLedgerMetadata
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata, LedgerState
from pora.meta.store import MetadataStore

#: a record that keeps changing under the worker (a busy writer's ensemble changes)
#: is re-read at most this many times before the repair is left for the next run
CAS_ATTEMPTS = 20


def with_members_replaced(
    record: LedgerMetadata,
    first_entry_id: int,
    replacements: Mapping[int, tuple[EnsembleMember, EnsembleMember]],
) -> LedgerMetadata | None:
    """The record with the ensemble starting at `first_entry_id` given, at each
    position, the new member of `(old, new)`; None when that is no longer a repair to
    make (A7, A9, A12): the ensemble is gone, a position holds another member than
    `old`, the ensemble is an open ledger's last one, or the ledger is in recovery."""
    if record.state is LedgerState.IN_RECOVERY:
        return None
    ensembles = list(record.ensembles)
    index = next((i for i, e in enumerate(ensembles) if e.first_entry_id == first_entry_id), None)
    if index is None:
        return None
    if record.state is LedgerState.OPEN and index == len(ensembles) - 1:
        return None
    ensemble = ensembles[index]
    members = list(ensemble.members)
    standing = dict(ensemble.stands_for)
    for position, (old, new) in replacements.items():
        if members[position] != old:
            return None
        members[position] = new
        # A8: the position keeps standing for the writer's member, unless that is new
        if standing.get(position) == new:
            del standing[position]
    ensembles[index] = Ensemble(first_entry_id, tuple(members), tuple(sorted(standing.items())))
    changed = replace(record, ensembles=tuple(ensembles))
    changed.validate()
    return changed


async def replace_members(
    store: MetadataStore,
    ledger_id: int,
    version: int,
    record: LedgerMetadata,
    first_entry_id: int,
    replacements: Mapping[int, tuple[EnsembleMember, EnsembleMember]],
) -> bool:
    """A7: compare-and-set the replacement on the record read at `version`; on a
    conflict re-read and apply it again while it still applies. True once written;
    False when the fragment changed so that it no longer does (someone else's work)."""
    for _ in range(CAS_ATTEMPTS):
        if _applied(record, first_entry_id, replacements):
            return True  # a write that timed out took, or another worker made it
        changed = with_members_replaced(record, first_entry_id, replacements)
        if changed is None:
            return False
        try:
            await store.update_ledger(changed, version)
        except (MetadataVersionConflict, MetadataTimeout):
            try:
                reread = await store.read_ledger(ledger_id)
            except NoSuchLedgerMetadata:
                return False  # deleted meanwhile
            record, version = reread.value, reread.version
        else:
            return True
    return False


def _applied(
    record: LedgerMetadata,
    first_entry_id: int,
    replacements: Mapping[int, tuple[EnsembleMember, EnsembleMember]],
) -> bool:
    ensemble = next((e for e in record.ensembles if e.first_entry_id == first_entry_id), None)
    return ensemble is not None and all(
        ensemble.members[position] == new for position, (_, new) in replacements.items()
    )
