"""Calls of the per-node client: a request's frames sent on the connection, and its
caller woken by its responses (matched by request id) or by its deadline.

A call that names the node instance it expects waits for the node to say who it
is on the connection, and sends nothing to another instance (`InstanceMismatch`).
Responses come back as values; an error response as the engine's exception.
"""

from __future__ import annotations

from typing import TypeVar

import anyio

from journal.errors import PoraError
from netio.errors import ConnectionLost, InstanceMismatch, ProtocolError, RequestTimeout
from netio.frames import Status
from netio.messages import ErrorResponse, ResponseMessage
from netio.security import master_key_from_password
from pora.client.connection import NodeConnection
from pora.client.remote_errors import clone_error, error_from_response
from pora.client.session import Session, Waiter

_Response = TypeVar("_Response", bound=ResponseMessage)


class RequestClient(NodeConnection):
    """Requests and their responses over a `NodeConnection`, within deadlines."""

    async def _check_instance(
        self, session: Session, instance_id: str | None, timeout_s: float
    ) -> None:
        """When the caller names the node instance it expects: wait (within its
        timeout) for the node to say who it is on this connection, and raise
        InstanceMismatch, before anything is sent, if it is another."""
        if instance_id is None:
            return
        await self._await_identity(session, timeout_s)
        if session.instance_id != instance_id:
            raise InstanceMismatch(self.address, instance_id, session.instance_id)

    async def _await_identity(self, session: Session, timeout_s: float) -> None:
        """Wait (within `timeout_s`) for the node's answer to the connection's INFO."""
        if not session.identified.is_set():
            with anyio.move_on_after(timeout_s):
                await session.identified.wait()
        if not session.alive:
            raise ConnectionLost(
                f"connection to node {self.address} lost before it said who it is; nothing "
                "was sent. Retry: the next call reconnects"
            )
        if not session.identified.is_set():
            raise RequestTimeout(
                f"node {self.address} did not say who it is (INFO) within {timeout_s} s; "
                "nothing was sent"
            )

    async def _call(
        self,
        frames: list[bytes],
        request_ids: list[int],
        timeout_s: float | None,
        instance_id: str | None = None,
    ) -> list[ResponseMessage | PoraError]:
        """Send frames (one buffer may hold many) for `request_ids` and wait for their
        responses (errors as values, in the order of `request_ids`)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        left_s = timeout
        session = await self._connected()
        if self._room_waiters or self._busy(session):
            left_s = await self._wait_for_room(timeout)
            session = await self._connected()
        await self._check_instance(session, instance_id, left_s)
        waiter = Waiter(len(request_ids), self._new_event())
        pending = session.pending
        for index, request_id in enumerate(request_ids):
            pending[request_id] = (waiter, index)
        session.outbox.extend(frames)
        session.outbox_ready.set()
        bucket = self._track_deadline(waiter, left_s)
        try:
            await waiter.event.wait()
        finally:
            waiters = self._deadlines.get(bucket)
            if waiters is not None:
                waiters.discard(waiter)
            if waiter.remaining:
                for request_id in request_ids:
                    pending.pop(request_id, None)
                if self._room_waiters:
                    self._grant_room(len(pending))
        if waiter.timed_out:
            raise RequestTimeout(
                f"no response from node {self.address} within {timeout} s; the request may "
                "or may not have been performed"
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

    async def _call_one(
        self,
        frame: bytes,
        request_id: int,
        timeout_s: float | None,
        expected: type[_Response],
        instance_id: str | None = None,
    ) -> _Response:
        """The response to one request, of the type its request is answered with; the
        node's error raised as its exception."""
        (result,) = await self._call([frame], [request_id], timeout_s, instance_id)
        if isinstance(result, PoraError):
            raise result
        if not isinstance(result, expected):
            raise ProtocolError(
                f"node {self.address} answered request {request_id} with "
                f"{type(result).__name__}, not {expected.__name__}",
                status=Status.BAD_REQUEST,
                request_id=request_id,
            )
        return result

    @staticmethod
    def _key(master_key: bytes, password: str | bytes | None) -> bytes:
        return master_key_from_password(password) if password is not None else master_key


__all__ = ["RequestClient"]
