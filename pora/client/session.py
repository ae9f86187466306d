"""One connection of the per-node client: the node's identity (`NodeInfo`) and the
`Session` (stream, operations in flight, frames to send)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Final

import anyio
import anyio.abc

from netio.codec import ResponseDecoder
from pora.client.coalescer import QueuedAdd
from pora.client.pending import PendingOperation

RECEIVE_BYTES: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class NodeInfo:
    protocol_version: int
    server_version: str
    #: why the node refuses writes, or None when it takes them
    read_only_reason: str | None
    frame_bytes_max: int
    entry_bytes_max: int
    ledger_count: int
    #: the node's data-dir instance id (a wiped data dir has a new one)
    instance_id: str = ""


class Session:
    """One connection: its stream, its requests in flight, its frames to send."""

    def __init__(self, stream: anyio.abc.ByteStream, frame_bytes_max: int) -> None:
        self.stream = stream
        self.decoder = ResponseDecoder(frame_bytes_max, RECEIVE_BYTES)
        #: request id -> (the operation its response goes to, the response's index
        #: in it)
        self.pending: dict[int, tuple[PendingOperation, int]] = {}
        self.outbox: list[bytes] = []
        self.outbox_ready = anyio.Event()
        self.error: BaseException | None = None
        self.alive = True
        self.cancel_scope = anyio.CancelScope()
        #: the node's frame_bytes_max, once asked on this connection (a reconnect
        #: may reach a node restarted with another)
        self.node_frame_bytes_max: int | None = None
        #: the node's entry_bytes_max and data-dir instance id, from its INFO at connect
        self.node_entry_bytes_max = 0
        self.instance_id = ""
        #: coalesced adds queued for the writer task, which frames them each turn
        self.add_queue: list[QueuedAdd] = []
        #: the plain TCP socket under the stream when frames may be sent on it at once,
        #: outside the writer task (under trio, without TLS), else None
        self.raw_socket: socket.socket | None = None
        #: the writer task waits for frames (its outbox empty)
        self.writer_idle = False
        #: the node's port and this end's, naming the connection in trace records
        self.ports = (0, 0)
        #: set once the node answered the connection's first request, its INFO
        self.identified = anyio.Event()
        self.info: NodeInfo | None = None


def why_lost(error: BaseException | None) -> str:
    """Why a connection ended, for its ConnectionLost message."""
    if error is None:
        return "the node closed it"
    text = str(error) or str(error.__cause__ or "")
    kind = type(error).__name__
    if isinstance(error, anyio.BrokenResourceError | anyio.ClosedResourceError | OSError):
        kind = f"the connection broke: {kind}"
    return f"{kind}: {text}" if text else kind


__all__ = [
    "RECEIVE_BYTES",
    "NodeInfo",
    "Session",
    "why_lost",
]
