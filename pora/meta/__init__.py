"""The cluster's metadata store: ledger ids, ledger metadata, node registrations and
streams, behind one interface with an embedded SQLite and a ZooKeeper backend."""
