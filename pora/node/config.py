"""A node's configuration: every limit and knob, with defaults, in one frozen record.

`open_node(data_dir, **options)` takes any field of `GroupCommitConfig`,
`LedgerConfig` or `NodeConfig` by name; `NodeConfig.from_options` routes each to the
record that owns it, so a typo is an error rather than a silently ignored option.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from journal.task import GroupCommitConfig
from ledger.storage import LedgerConfig


@dataclass(frozen=True, slots=True)
class NodeConfig:
    journal: GroupCommitConfig = field(default_factory=GroupCommitConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    #: the largest payload one add may carry
    entry_bytes_max: int = 4 << 20
    #: LevelDB block cache of the index
    index_cache_bytes: int = 64 << 20
    #: bloom filter bits per key of the index (speeds up lookups of missing entries)
    index_bloom_bits: int = 10
    #: how often the trimmer looks for journal segments it may delete
    trim_interval_ms: float = 1000.0
    #: ledgers not (yet) on this node that long polls may wait for at once: a tail
    #: reader may wait for the first entry of a ledger striped here; past this many
    #: such ledgers a long poll on one more fails at once with NoSuchLedger
    long_polls_unknown_ledgers_max: int = 10_000

    def __post_init__(self) -> None:
        if not 0 < self.entry_bytes_max <= 64 << 20:
            raise ValueError("entry_bytes_max must be in (0, 64 MiB]")
        if self.entry_bytes_max > self.journal.group_bytes_max * 64:
            raise ValueError("entry_bytes_max is out of proportion to group_bytes_max")
        if self.long_polls_unknown_ledgers_max < 0:
            raise ValueError("long_polls_unknown_ledgers_max must be >= 0")

    @classmethod
    def from_options(cls, **options: Any) -> NodeConfig:
        """Build a config from flat keyword options (see module docstring)."""
        sections: dict[str, dict[str, Any]] = {"journal": {}, "ledger": {}, "node": {}}
        owners = {
            "journal": {f.name for f in dataclasses.fields(GroupCommitConfig)},
            "ledger": {f.name for f in dataclasses.fields(LedgerConfig)},
            "node": {f.name for f in dataclasses.fields(cls)} - {"journal", "ledger"},
        }
        for name, value in options.items():
            for section, names in owners.items():
                if name in names:
                    sections[section][name] = value
                    break
            else:
                known = sorted(set().union(*owners.values()))
                raise TypeError(f"unknown node option {name!r}; known options: {', '.join(known)}")
        if "fsync" in sections["journal"]:
            sections["ledger"].setdefault("fsync", sections["journal"]["fsync"])
        return cls(
            journal=GroupCommitConfig(**sections["journal"]),
            ledger=LedgerConfig(**sections["ledger"]),
            **sections["node"],
        )
