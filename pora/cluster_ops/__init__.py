"""The cluster tools that work across nodes through the metadata store and the
replicating client: the audit of under-replicated fragments, their re-replication,
and a node's decommission (docs/rereplication.md). Nothing here runs on a node."""
