"""Clients of Pora nodes: the per-node client (`connect_node`). It speaks the wire
protocol (`netio`) and never imports the node or the server."""
