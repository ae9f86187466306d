"""The replicating client's deterministic core: the replicated entry format,
placement, quorum bookkeeping and the ledger records a writer or a recovery builds.

Nothing here does I/O, awaits or reads a clock (time is passed in), so the I/O layer
and a seeded simulation drive the same code. The rules it implements (R1..R25) are
in docs/replication.md; each function names the rule it serves.
"""
