"""The in-process node: `open_node` composes the journal and the ledgers of one data
dir into a running `Node`; its config, its data dir, and the journal replay at
start. It knows no wire format: the server puts the protocol in front of it."""

from pora.node.config import NodeConfig
from pora.node.lifecycle import open_node
from pora.node.node import Node, NodeStatistics

__all__ = ["Node", "NodeConfig", "NodeStatistics", "open_node"]
