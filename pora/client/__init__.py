"""Clients of Pora nodes. The per-node client (`connect_node`, `node_client.py` and
the modules it is built from) speaks the wire protocol (`netio`) to one node;
`NodeChannel` (`node_channel.py`) is the seam the replicating client (`replication/`,
`pora.connect`) reaches every node through, over TCP (`tcp_channel.py`) or to an
in-process node (`local_channel.py`, tests). Nothing here imports the node or the
server (docs/architecture.md)."""
