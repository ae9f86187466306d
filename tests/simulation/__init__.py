"""A deterministic simulation of replication: in-process nodes behind a seeded fake
network under a mock clock, writers, recoveries and readers racing, invariants
checked after every step (see scenarios.py)."""
