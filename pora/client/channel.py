"""The replicating client's view of one node: `NodeChannel`, over TCP or in process.

The replicating client talks to each node of an ensemble through this one
interface (pora.client.node_channel). `TcpChannel` (pora.client.tcp_channel)
drives a `NodeClient` (`connect_node`): adds are coalesced with every other add to
that node in the same scheduler turn, and the node's instance id is learnt from
the INFO asked first on every connection. `LocalChannel`
(pora.client.local_channel) drives an in-process `Node` (`pora.open_node`), with
no sockets: for tests and the deterministic simulation. Both give the same
outcomes and raise the same error types for the same node.

Every call may name the node instance it expects (`instance_id`, as an ensemble
records it): a node answering from another instance (its data dir was wiped or
replaced) raises `InstanceMismatch`, and the request is not sent to it.

This module is the import path of all of them (re-exported from their modules).
"""

from __future__ import annotations

from pora.client.local_channel import InProcessNode, LocalChannel
from pora.client.node_channel import NodeChannel, NodeIdentity, RangeAnswer
from pora.client.tcp_channel import TcpChannel

__all__ = [
    "InProcessNode",
    "LocalChannel",
    "NodeChannel",
    "NodeIdentity",
    "RangeAnswer",
    "TcpChannel",
]
