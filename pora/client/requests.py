"""Calls of the per-node client: a request's frames sent on the connection, and its
caller woken by its responses (matched by request id) or by its deadline.

A call that names the node instance it expects waits for the node to say who it
is on the connection, and sends nothing to another instance (`InstanceMismatch`).
Responses come back as values; an error response as the engine's exception.
"""

from __future__ import annotations

from typing import TypeVar

from journal.errors import PoraError
from netio.errors import ProtocolError, RequestTimeout
from netio.frames import Status
from netio.messages import ErrorResponse, ResponseMessage
from netio.security import master_key_from_password
from pora.client.connection import NodeConnection
from pora.client.pending import RequestWaiter
from pora.client.remote_errors import clone_error, error_from_response

_Response = TypeVar("_Response", bound=ResponseMessage)


async def call(
    connection: NodeConnection,
    frames: list[bytes],
    request_ids: list[int],
    timeout_s: float | None,
    instance_id: str | None = None,
) -> list[ResponseMessage | PoraError]:
    """Send frames (one buffer may hold many) for `request_ids` and wait for their
    responses (errors as values, in the order of `request_ids`)."""
    timeout = connection.timeout_s if timeout_s is None else timeout_s
    count = len(request_ids)
    size = sum([len(frame) for frame in frames])
    session, left_s = await connection.room(count, size, timeout)
    try:
        await connection.check_instance(session, instance_id, left_s)
        waiter = RequestWaiter(count, connection.new_event(), connection.now() + left_s)
        pending = session.pending
        for index, request_id in enumerate(request_ids):
            pending[request_id] = (waiter, index)
        session.outbox.extend(frames)
        session.outbox_ready.set()
        if connection.deadlines.idle:
            connection.deadlines.wake()
        try:
            await waiter.event.wait()
        finally:
            if waiter.remaining:
                for request_id in request_ids:
                    pending.pop(request_id, None)
    finally:
        connection.admission.release(count, size)
    if waiter.timed_out:
        raise RequestTimeout(
            f"no response from node {connection.address} within {timeout} s; the request "
            "may or may not have been performed"
        )
    if waiter.error is not None:
        # one error fails many waiters: each raises its own copy, so that their
        # tracebacks do not pile up on one shared exception object
        raise clone_error(waiter.error)
    results: list[ResponseMessage | PoraError] = []
    for response in waiter.responses:
        assert response is not None
        if isinstance(response, ErrorResponse):
            results.append(error_from_response(response))
        else:
            results.append(response)
    return results


async def call_one(
    connection: NodeConnection,
    frame: bytes,
    request_id: int,
    timeout_s: float | None,
    expected: type[_Response],
    instance_id: str | None = None,
) -> _Response:
    """The response to one request, of the type its request is answered with; the
    node's error raised as its exception."""
    (result,) = await call(connection, [frame], [request_id], timeout_s, instance_id)
    if isinstance(result, PoraError):
        raise result
    if not isinstance(result, expected):
        raise ProtocolError(
            f"node {connection.address} answered request {request_id} with "
            f"{type(result).__name__}, not {expected.__name__}",
            status=Status.BAD_REQUEST,
            request_id=request_id,
        )
    return result


def key_of(master_key: bytes, password: str | bytes | None) -> bytes:
    """The ledger's master key: derived from `password` when one is given."""
    return master_key_from_password(password) if password is not None else master_key


__all__ = ["call", "call_one", "key_of"]
