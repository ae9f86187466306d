"""Errors of the network layer. Their root is `PoraError`, shared with the engine."""

from __future__ import annotations

from journal.errors import PoraError


class ProtocolError(PoraError):
    """Bytes that are not a valid frame of this protocol.

    `request_id` is the id of the offending frame when its header could be read
    (the server then answers that id before closing the connection), else None.
    `status` is the status code to answer with (bad request, or too large).
    """

    def __init__(
        self, message: str, *, status: int, request_id: int | None = None, opcode: int = 0
    ) -> None:
        self.status = status
        self.request_id = request_id
        self.opcode = opcode
        super().__init__(message)


class NodeOverloaded(PoraError):
    """The node refused the request because too many are in flight; retry later."""


class RemoteError(PoraError):
    """The node failed the request for a reason the client has no better type for
    (an internal error on the node, or a status this client does not know)."""


class ConnectionLost(PoraError):
    """The connection to the node broke or could not be made; the request's outcome
    is unknown (an add may or may not be stored: retrying it with the same bytes is safe)."""


class RequestTimeout(PoraError, TimeoutError):
    """No response came within the request's timeout; its outcome is unknown."""


class InstanceMismatch(PoraError):
    """The node at the address answers from another data-dir instance than the one
    the caller expects (its data dir was wiped or replaced): the request was not
    sent. What the caller recorded of that node (entries, fences) is not there."""

    def __init__(self, address: str, expected: str, actual: str) -> None:
        self.address = address
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"node {address} answers from data-dir instance {actual!r}, not the expected "
            f"{expected!r}: its data dir was replaced, so it does not hold what was stored "
            "on it before. The request was not sent; treat the node as a new one"
        )
