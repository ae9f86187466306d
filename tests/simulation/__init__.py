"""A deterministic simulation of replication: in-process nodes, each behind its real
server, reached through the real client and wire over a seeded in-memory network,
on a disk that fails and forgets what was not synced, under a mock clock; writers,
recoveries and readers racing, invariants checked after every step (see
scenarios.py, plans.py, network.py, wire.py, disk.py, cluster.py, clock.py)."""
