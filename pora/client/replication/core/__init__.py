"""The replicating client's pure core: the decisions of docs/replication.md's rules
as plain code that does no I/O, never awaits and reads no clock (time is passed in),
so that unit tests and the seeded simulation drive it without an event loop.

- `quorum.py`: R3's write sets (`write_set_positions`, the rule written once) and
  the acknowledgement count (`AckTracker`: R4, R6, R9, R10).
- `pending_adds.py`: a writer's pending adds as one state machine (`PendingAdds`):
  ids, encoded entries, each turn's batches per member, acknowledgements and the
  LAC, failures, and what a replacement must be sent.
- `refusals.py`: R13, a node's refusal of an add sorted (`sort_refusal`): the
  writer ends, or the member fails.
- `placement.py` (R1, R2, R9's choice), `recovery_votes.py` (R16..R19),
  `ledger_records.py` (the record's transitions) and `entry_format.py` (an entry
  on the wire, with its checksum).

tests/test_import_rules.py fails when a module here imports anyio, trio, a socket,
a file or a clock.
"""
