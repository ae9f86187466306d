"""The client of one node: `connect_node("host:port")` (asyncio or trio, through anyio).

Every operation of the in-process node, over one pipelined connection: any number
of tasks call at once, their frames are coalesced into few sends by one writer
task, and one reader task hands each response to its caller by request id
(responses come back in completion order, not request order). Failures raise the
engine's own exception types (`pora.NoSuchEntry`, `pora.LedgerFenced`, ...), with
the node's message. A broken connection fails what was in flight with
`ConnectionLost` and the next call reconnects, with exponential backoff.

`NodeClient` is built in layers, one module each: the connection and its tasks
(pora.client.connection, over pora.client.session and pora.client.deadlines),
calls matched to their responses (pora.client.requests), the adds
(pora.client.adds), and here the reads, the ledger operations and `connect_node`.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

import anyio

from netio import frames as f
from netio.codec import encode_request
from netio.errors import ConnectionLost
from netio.messages import (
    Close,
    CloseResponse,
    Delete,
    DeleteResponse,
    Fence,
    FenceResponse,
    Info,
    InfoResponse,
    LacResponse,
    LedgerSummary,
    ListLedgers,
    ListLedgersResponse,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadRange,
    ReadRangeResponse,
    WriteLac,
    WriteLacResponse,
)
from pora.client.adds import AddClient
from pora.client.connection import StreamOpener
from pora.client.lone_errors import lone_error_unwrapped
from pora.client.remote_errors import error_from_response
from pora.client.session import NodeInfo


class NodeClient(AddClient):
    """A pipelined connection to one node. Make one with `connect_node`."""

    async def read_entry(
        self,
        ledger_id: int,
        entry_id: int,
        *,
        wait_s: float = 0.0,
        fence: bool = False,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
    ) -> bytes:
        """The entry's payload. `wait_s` > 0: long poll (wait for the entry to arrive,
        else NoSuchEntry); `fence`: fence the ledger first (a recovery read)."""
        payload, _lac = await self.read_entry_and_lac(
            ledger_id,
            entry_id,
            wait_s=wait_s,
            fence=fence,
            master_key=master_key,
            password=password,
            timeout_s=timeout_s,
        )
        return payload

    async def read_entry_and_lac(
        self,
        ledger_id: int,
        entry_id: int,
        *,
        wait_s: float = 0.0,
        fence: bool = False,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> tuple[bytes, int]:
        """`read_entry`, plus the ledger's last-add-confirmed as the node knows it."""
        request_id = self._new_id()
        wait_ms = max(0, min(round(wait_s * 1000), 2**32 - 1))
        frame = encode_request(
            ReadEntry(
                request_id,
                ledger_id,
                entry_id,
                wait_ms,
                fence,
                self._key(master_key, password),
            )
        )
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        response = await self._call_one(frame, request_id, timeout, ReadEntryResponse, instance_id)
        return response.payload, response.last_add_confirmed

    async def read_range(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_entries: int = 1000,
        max_bytes: int = 1 << 20,
        timeout_s: float | None = None,
    ) -> list[tuple[int, bytes]]:
        """The entries stored in [first, last], in order, up to the limits (the node
        may return fewer: ask again after the last one returned)."""
        entries, _lac, _more = await self.read_range_page(
            ledger_id,
            first_entry_id,
            last_entry_id,
            max_entries=max_entries,
            max_bytes=max_bytes,
            timeout_s=timeout_s,
        )
        return entries

    async def last_add_confirmed(self, ledger_id: int, *, timeout_s: float | None = None) -> int:
        request_id = self._new_id()
        frame = encode_request(ReadLac(request_id, ledger_id))
        response = await self._call_one(frame, request_id, timeout_s, LacResponse)
        return response.last_add_confirmed

    async def read_range_page(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_entries: int = 1000,
        max_bytes: int = 1 << 20,
        fence_key: bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> tuple[list[tuple[int, bytes]], int, bool]:
        """`(entries, last_add_confirmed, more)`: the entries stored in [first, last]
        up to the limits, and whether the node stopped before `last` (then the
        answer is complete only through its last entry; ids in it not returned are
        not stored there). With `fence_key`, the ledger is fenced first."""
        request_id = self._new_id()
        frame = encode_request(
            ReadRange(
                request_id,
                ledger_id,
                first_entry_id,
                last_entry_id,
                max_entries,
                max_bytes,
                fence_key is not None,
                fence_key or b"",
            )
        )
        response = await self._call_one(
            frame, request_id, timeout_s, ReadRangeResponse, instance_id
        )
        return response.entries, response.last_add_confirmed, response.more

    async def read_lac(
        self,
        ledger_id: int,
        *,
        known_lac: int = -1,
        wait_s: float = 0.0,
        fence_key: bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> tuple[int, int]:
        """`(last_add_confirmed, last_entry_id)` of the ledger on the node. `wait_s` >
        0: a long poll, answered once the LAC passes `known_lac`, the ledger is closed
        or fenced, or the wait ends (then with the current values). With
        `fence_key`, the ledger is fenced first (created fenced if unknown here)."""
        request_id = self._new_id()
        wait_ms = max(0, min(round(wait_s * 1000), 2**32 - 1))
        frame = encode_request(
            ReadLac(
                request_id, ledger_id, known_lac, wait_ms, fence_key is not None, fence_key or b""
            )
        )
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        response = await self._call_one(frame, request_id, timeout, LacResponse, instance_id)
        return response.last_add_confirmed, response.last_entry_id

    async def read_lac_and_entry(
        self,
        ledger_id: int,
        *,
        known_lac: int,
        wait_s: float = 0.0,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> tuple[int, int, bytes | None]:
        """`read_lac`, answered with the stored bytes of entry `known_lac + 1` too
        (None when the node does not hold it) in the same round trip. The entry may
        be above the LAC answered: a reader returns it only once a LAC covers it."""
        request_id = self._new_id()
        wait_ms = max(0, min(round(wait_s * 1000), 2**32 - 1))
        frame = encode_request(ReadLac(request_id, ledger_id, known_lac, wait_ms, with_entry=True))
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        response = await self._call_one(frame, request_id, timeout, LacResponse, instance_id)
        return response.last_add_confirmed, response.last_entry_id, response.entry

    async def write_lac(
        self,
        ledger_id: int,
        last_add_confirmed: int,
        *,
        master_key: bytes = b"",
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> int:
        """Tell the node the writer's LAC (it keeps the highest, in memory); returns
        the node's LAC for the ledger after."""
        request_id = self._new_id()
        frame = encode_request(WriteLac(request_id, ledger_id, last_add_confirmed, master_key))
        response = await self._call_one(frame, request_id, timeout_s, WriteLacResponse, instance_id)
        return response.last_add_confirmed

    async def fence_ledger(
        self,
        ledger_id: int,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Shut the ledger's writer out; returns the last entry id stored on the node."""
        request_id = self._new_id()
        frame = encode_request(Fence(request_id, ledger_id, self._key(master_key, password)))
        response = await self._call_one(frame, request_id, timeout_s, FenceResponse)
        return response.last_entry_id

    async def close_ledger(
        self,
        ledger_id: int,
        last_entry_id: int | None = None,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> int:
        """Seal the ledger at `last_entry_id` (or at its last stored entry)."""
        request_id = self._new_id()
        frame = encode_request(
            Close(request_id, ledger_id, last_entry_id, self._key(master_key, password))
        )
        response = await self._call_one(frame, request_id, timeout_s, CloseResponse, instance_id)
        return response.last_entry_id

    async def delete_ledger(
        self,
        ledger_id: int,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> None:
        """Delete the ledger and its entries on the node; only with the ledger's key
        (its password): else Unauthorized, and nothing is deleted."""
        request_id = self._new_id()
        frame = encode_request(Delete(request_id, ledger_id, self._key(master_key, password)))
        await self._call_one(frame, request_id, timeout_s, DeleteResponse, instance_id)

    async def list_ledgers(
        self, *, page_size: int = 1000, timeout_s: float | None = None
    ) -> list[LedgerSummary]:
        """Every ledger on the node, by id (fetched a page at a time)."""
        ledgers: list[LedgerSummary] = []
        after = -1
        while True:
            request_id = self._new_id()
            frame = encode_request(ListLedgers(request_id, after, page_size))
            response = await self._call_one(frame, request_id, timeout_s, ListLedgersResponse)
            ledgers.extend(response.ledgers)
            if not response.more or not response.ledgers:
                return ledgers
            after = response.ledgers[-1].ledger_id

    async def identity(self, *, timeout_s: float | None = None) -> NodeInfo:
        """Who the node on the current connection is, from the INFO the client asks
        first on every connection (no new request; connects if need be)."""
        session = await self._connected()
        await self._await_identity(session, self.timeout_s if timeout_s is None else timeout_s)
        if not session.alive:
            session = await self._connected()
            await self._await_identity(session, self.timeout_s if timeout_s is None else timeout_s)
        info = session.info
        if info is None:
            raise ConnectionLost(f"connection to node {self.address} lost before it said who it is")
        return info

    async def info(self, *, timeout_s: float | None = None) -> NodeInfo:
        """What the node says about itself (also a ping)."""
        request_id = self._new_id()
        response = await self._call_one(
            encode_request(Info(request_id)), request_id, timeout_s, InfoResponse
        )
        return NodeInfo(
            protocol_version=response.protocol_version,
            server_version=response.server_version,
            read_only_reason=response.read_only_reason,
            frame_bytes_max=response.frame_bytes_max,
            entry_bytes_max=response.entry_bytes_max,
            ledger_count=response.ledger_count,
            instance_id=response.instance_id,
        )


def _ssl_context(tls: bool | ssl.SSLContext, tls_ca_file: str | None) -> ssl.SSLContext | None:
    if isinstance(tls, ssl.SSLContext):
        return tls
    if not tls and tls_ca_file is None:
        return None
    return ssl.create_default_context(cafile=tls_ca_file)


@contextlib.asynccontextmanager
async def connect_node(
    address: str,
    *,
    timeout_s: float = 30.0,
    connect_timeout_s: float = 10.0,
    tls: bool | ssl.SSLContext = False,
    tls_ca_file: str | None = None,
    inflight_max: int = 65_536,
    inflight_bytes_max: int = 256 << 20,
    frame_bytes_max: int = f.FRAME_BYTES_MAX_DEFAULT,
    reconnect_attempts: int = 5,
    backoff_initial_s: float = 0.05,
    backoff_max_s: float = 2.0,
    open_stream: StreamOpener | None = None,
) -> AsyncIterator[NodeClient]:
    """Connect to the node at "host:port" (port 3181 if omitted) for the block.

    `timeout_s` bounds each request (long polls add their wait); `frame_bytes_max`
    bounds the frames this client accepts and those `add_entries` packs (the node's
    own limit too, if lower, is asked for that); `tls=True` checks
    the node's certificate against the system's CAs, `tls_ca_file` against a
    file's (a self-signed node), or pass your own SSLContext. A lost connection is
    re-made on the next call, up to `reconnect_attempts` tries with exponential
    backoff from `backoff_initial_s` to `backoff_max_s`. `open_stream` replaces
    TCP (and TLS) with the given opener (the simulation's in-memory links).
    """
    with lone_error_unwrapped():
        async with anyio.create_task_group() as task_group:
            client = NodeClient(
                address,
                task_group,
                timeout_s=timeout_s,
                connect_timeout_s=connect_timeout_s,
                ssl_context=_ssl_context(tls, tls_ca_file),
                inflight_max=inflight_max,
                inflight_bytes_max=inflight_bytes_max,
                frame_bytes_max=frame_bytes_max,
                reconnect_attempts=reconnect_attempts,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=backoff_max_s,
                open_stream=open_stream,
            )
            task_group.start_soon(client._sweep_deadlines)
            try:
                session = await client._connected()
                # (a node that says nothing is found by the first call's timeout)
                with anyio.move_on_after(min(timeout_s, connect_timeout_s)):
                    await session.identified.wait()
                yield client
            finally:
                await client.aclose()


__all__ = ["NodeClient", "NodeInfo", "connect_node", "error_from_response"]
