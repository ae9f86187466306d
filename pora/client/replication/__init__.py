"""The replicating client (`pora.connect`): ledgers written to and read from ensembles
of nodes under the rules R1..R27 of docs/replication.md; each function names the rule
it serves.

The decisions are the pure room `core/` (no I/O, no awaits, no clock): write sets and
acknowledgements, a writer's pending adds as one state machine, R13's sorting of
refusals, placement, recovery
votes, the ledger records and the entry format. Beside it `arguments.py`, `config.py`
and `errors.py` are plain values too. The rest does the I/O around the core on anyio:
`client.py` (`connect`, `Client`), `writer.py` and `backlog.py` (the write path),
`ensemble_change.py`, `recovery.py` and `recovery_adds.py`, `reader.py`,
`replica_reads.py` and `tail.py`; the channels to the nodes are
`pora.client.node_pool`'s (one per node), the add calls on them
`pora.client.node_calls`', the byte budgets netio's (`netio/budget.py`).
docs/architecture.md walks an append through them.
"""
