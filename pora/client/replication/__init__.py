"""The replicating client (`pora.connect`): ledgers written to and read from ensembles
of nodes under the rules R1..R27 of docs/replication.md; each function names the rule
it serves.

The decisions are pure modules that do no I/O, never await and read no clock (time
is passed in), so that tests and a seeded simulation drive them without sockets:
`quorum.py` (write sets, acknowledgements), `placement.py`, `recovery_votes.py`,
`ledger_records.py`, `entry_format.py`, `arguments.py`, `config.py` and `errors.py`.
The rest does the I/O around them on anyio: `client.py` (`connect`, `Client`),
`writer.py`, `sender.py` and `node_senders.py` (the write path), `ensemble_change.py`,
`recovery.py` and `recovery_adds.py`, `reader.py`, `replica_reads.py` and `tail.py`;
the channels to the nodes are `pora.client.node_pool`'s (one per node), the byte
budgets netio's (`netio/budget.py`). docs/architecture.md walks an append through
them.
"""
