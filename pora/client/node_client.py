"""The client of one node: `connect_node("host:port")` (asyncio or trio, through anyio).

Every operation of the in-process node, over one pipelined connection: any number
of tasks call at once, their frames are coalesced into few sends by one writer
task, and one reader task hands each response to its caller by request id
(responses come back in completion order, not request order). Failures raise the
engine's own exception types (`pora.NoSuchEntry`, `pora.LedgerFenced`, ...), with
the node's message. A broken connection fails what was in flight with
`ConnectionLost` and the next call reconnects, with exponential backoff.

`NodeClient` holds one `NodeConnection` (pora.client.connection: the session,
its reader and writer tasks, the room its callers wait for, the deadline sweep)
and makes its calls through it: requests matched to their responses
(pora.client.requests), the adds (pora.client.adds), and here the reads, the
ledger operations and `connect_node`.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

import anyio
import anyio.abc

from journal.errors import PoraError
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
from pora.client import adds
from pora.client.coalescer import QueuedAdd
from pora.client.connection import NodeConnection, StreamOpener, tcp_opener
from pora.client.ledger_frames import Outcomes
from pora.client.lone_errors import lone_error_unwrapped
from pora.client.node_channel import AddRequest
from pora.client.remote_errors import error_from_response
from pora.client.requests import call_one, key_of
from pora.client.session import NodeInfo


class NodeClient:
    """A pipelined connection to one node. Make one with `connect_node`.

    The add methods but `add_entry`'s lean path return their coroutine from
    pora.client.adds as it is (no coroutine of their own: every level of
    coroutines is resumed again at each wake-up, once per add)."""

    def __init__(self, connection: NodeConnection) -> None:
        self._connection = connection
        self.address = connection.address
        self.host, self.port = connection.host, connection.port
        self.timeout_s = connection.timeout_s

    @property
    def connection(self) -> NodeConnection:
        """The connection its calls go over (the TCP channel makes its adds on it,
        with pora.client.adds, as these methods do; a posted add, answered by
        callback, is the channel's alone: `TcpChannel.post_adds`)."""
        return self._connection

    @property
    def reconnects(self) -> int:
        """Connections re-made after a loss."""
        return self._connection.reconnects

    async def start(self) -> None:
        """Start the client's tasks and connect; returns once the node said who it
        is (or the connect timeout passed: a node that says nothing is found by
        the first call's timeout)."""
        connection = self._connection
        connection.start()
        session = await connection.connected()
        with anyio.move_on_after(min(connection.timeout_s, connection.connect_timeout_s)):
            await session.identified.wait()

    async def aclose(self) -> None:
        await self._connection.aclose()

    # --- adds ----------------------------------------------------------------------------------

    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """Store an entry on the node; returns once it is durable there.

        `password` (or an already derived `master_key`) must match the ledger's;
        `last_add_confirmed` piggybacks the writer's LAC for tail readers;
        `recovery` marks an add of a recovery, which a fenced ledger accepts.
        """
        key = master_key if password is None else key_of(master_key, password)
        connection = self._connection
        session = connection.session
        size = len(payload)
        admission = connection.admission
        if session is None or not session.alive or not admission.try_admit(1, size):
            # connecting, or waiting in line for room: add_coalesced does both
            (outcome,) = await adds.add_coalesced(
                connection,
                ledger_id,
                [(entry_id, payload)],
                master_key=key,
                last_add_confirmed=last_add_confirmed,
                recovery=recovery,
                timeout_s=timeout_s,
            )
        else:
            # the common case, written here to be lean: one entry queued on a
            # connection with room (every coroutine level is resumed at each wake-up)
            timeout = connection.timeout_s if timeout_s is None else timeout_s
            try:
                call = connection.new_add_call(1, connection.now() + timeout)
                session.add_queue.append(
                    QueuedAdd(
                        ledger_id, key, recovery, entry_id, payload, last_add_confirmed, call, 0
                    )
                )
                if connection.deadlines.idle:
                    connection.deadlines.wake()
                ready = session.outbox_ready
                if not ready.is_set():
                    ready.set()
                await call.wait()
            finally:
                admission.release(1, size)
            if call.timed_out or call.error is not None:
                adds.raise_failed(connection, call, timeout)
            outcome = call.outcomes[0]
        if outcome is not None:
            raise outcome

    def add_coalesced(
        self,
        ledger_id: int,
        entries: Sequence[tuple[int, bytes]],
        *,
        master_key: bytes = b"",
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> Coroutine[Any, Any, list[PoraError | None]]:
        """Store `(entry_id, payload)` entries of one ledger, sharing frames with every
        other add queued on the connection in the same scheduler turn (ADD_RUN,
        ADD_BATCH or ADD_ENTRY frames; see pora.client.coalescer). One outcome per
        entry, in order: None (stored) or the error of that entry alone; a frame
        refused whole (a ledger refusal) gives each of its entries that error.
        Raises RequestTimeout or ConnectionLost (outcomes unknown: retrying with
        the same bytes is safe), and InstanceMismatch, sending nothing, when
        `instance_id` is given and the node answers from another instance."""
        return adds.add_coalesced(
            self._connection,
            ledger_id,
            entries,
            master_key=master_key,
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
            timeout_s=timeout_s,
            instance_id=instance_id,
        )

    def add_batches_many(
        self,
        requests: Sequence[AddRequest],
        *,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> Coroutine[Any, Any, list[Outcomes]]:
        """Several ledgers' batches as one caller, each batch one ledger's entries in
        increasing id order, encoded straight into frames (one per batch when it
        fits: see pora.client.ledger_frames): one wait (one event, one deadline) for
        all of them. One answer per request, in order: None when every entry of it
        was stored, else an outcome per entry as `add_coalesced` gives. Raises as
        `add_coalesced` (every request's outcomes unknown)."""
        return adds.add_batches_many(
            self._connection, requests, timeout_s=timeout_s, instance_id=instance_id
        )

    def add_run(
        self,
        ledger_id: int,
        first_entry_id: int,
        payloads: Sequence[bytes],
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> Coroutine[Any, Any, list[PoraError | None]]:
        """Store entries `first_entry_id`, `first_entry_id + 1`, ... with these payloads
        (1 to RUN_ENTRIES_MAX of them) in one ADD_RUN frame, answered by one response;
        returns once they are durable: one outcome per payload, in order (None: stored,
        else the engine's exception of an entry that failed alone, EntryConflict say).

        Raises the error that refused the whole run, when the node took none of it: a
        ledger refusal (Unauthorized, LedgerFenced, LedgerClosed, NodeReadOnly, ...)
        or one unfit entry (EntryTooLarge or InvalidArgument, its `entry_id` naming
        the entry). The frame must fit the node's frame_bytes_max, else the node
        refuses it with EntryTooLarge and drops the connection: `add_entries` cuts
        entries into runs that fit. Options as for `add_entry`.
        """
        return adds.add_run(
            self._connection,
            ledger_id,
            first_entry_id,
            payloads,
            master_key=master_key,
            password=password,
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
            timeout_s=timeout_s,
        )

    def add_entries(
        self,
        ledger_id: int,
        entries: Sequence[tuple[int, bytes]],
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> Coroutine[Any, Any, list[PoraError | None]]:
        """Store many `(entry_id, payload)` of one ledger; one outcome per entry, in
        the order given (None: stored, else the engine's exception).

        Entries whose ids go up by one in the order given travel as one run: one
        ADD_RUN frame of up to RUN_ENTRIES_MAX entries, cut where the frame would
        pass this client's frame_bytes_max or the node's, if lower (asked with an
        INFO, under the same timeout, on a connection's first `add_entries`). Every
        frame is sent at once, pipelined. Sparse or unordered ids work, as shorter
        runs.

        A run is refused whole, each of its entries getting that error and none of
        them stored, by a ledger refusal (Unauthorized, LedgerFenced, ...) and by
        an unfit entry: one entry over the node's entry_bytes_max (EntryTooLarge)
        or with a bad id (InvalidArgument) refuses its whole run, the error's
        `entry_id` naming it. An entry too large for any frame goes alone, and the
        node refuses it with EntryTooLarge and drops the connection. Entries of a
        run fail alone when they are stored already with other bytes (EntryConflict).
        A timeout or a lost connection raises RequestTimeout or ConnectionLost, as
        for every call: then each entry may or may not be stored (retrying with the
        same bytes is safe).
        """
        return adds.add_entries(
            self._connection,
            ledger_id,
            entries,
            master_key=master_key,
            password=password,
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
            timeout_s=timeout_s,
        )

    # --- reads and ledger operations -----------------------------------------------------------

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
        request_id = self._connection.new_id()
        wait_ms = max(0, min(round(wait_s * 1000), 2**32 - 1))
        frame = encode_request(
            ReadEntry(
                request_id,
                ledger_id,
                entry_id,
                wait_ms,
                fence,
                key_of(master_key, password),
            )
        )
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        response = await call_one(
            self._connection, frame, request_id, timeout, ReadEntryResponse, instance_id
        )
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
        request_id = self._connection.new_id()
        frame = encode_request(ReadLac(request_id, ledger_id))
        response = await call_one(self._connection, frame, request_id, timeout_s, LacResponse)
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
        request_id = self._connection.new_id()
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
        response = await call_one(
            self._connection, frame, request_id, timeout_s, ReadRangeResponse, instance_id
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
        request_id = self._connection.new_id()
        wait_ms = max(0, min(round(wait_s * 1000), 2**32 - 1))
        frame = encode_request(
            ReadLac(
                request_id, ledger_id, known_lac, wait_ms, fence_key is not None, fence_key or b""
            )
        )
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        response = await call_one(
            self._connection, frame, request_id, timeout, LacResponse, instance_id
        )
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
        request_id = self._connection.new_id()
        wait_ms = max(0, min(round(wait_s * 1000), 2**32 - 1))
        frame = encode_request(ReadLac(request_id, ledger_id, known_lac, wait_ms, with_entry=True))
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        response = await call_one(
            self._connection, frame, request_id, timeout, LacResponse, instance_id
        )
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
        request_id = self._connection.new_id()
        frame = encode_request(WriteLac(request_id, ledger_id, last_add_confirmed, master_key))
        response = await call_one(
            self._connection, frame, request_id, timeout_s, WriteLacResponse, instance_id
        )
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
        request_id = self._connection.new_id()
        frame = encode_request(Fence(request_id, ledger_id, key_of(master_key, password)))
        response = await call_one(self._connection, frame, request_id, timeout_s, FenceResponse)
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
        request_id = self._connection.new_id()
        frame = encode_request(
            Close(request_id, ledger_id, last_entry_id, key_of(master_key, password))
        )
        response = await call_one(
            self._connection, frame, request_id, timeout_s, CloseResponse, instance_id
        )
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
        request_id = self._connection.new_id()
        frame = encode_request(Delete(request_id, ledger_id, key_of(master_key, password)))
        await call_one(self._connection, frame, request_id, timeout_s, DeleteResponse, instance_id)

    async def list_ledgers(
        self, *, page_size: int = 1000, timeout_s: float | None = None
    ) -> list[LedgerSummary]:
        """Every ledger on the node, by id (fetched a page at a time)."""
        ledgers: list[LedgerSummary] = []
        after = -1
        while True:
            request_id = self._connection.new_id()
            frame = encode_request(ListLedgers(request_id, after, page_size))
            response = await call_one(
                self._connection, frame, request_id, timeout_s, ListLedgersResponse
            )
            ledgers.extend(response.ledgers)
            if not response.more or not response.ledgers:
                return ledgers
            after = response.ledgers[-1].ledger_id

    async def identity(self, *, timeout_s: float | None = None) -> NodeInfo:
        """Who the node on the current connection is, from the INFO the client asks
        first on every connection (no new request; connects if need be)."""
        connection = self._connection
        timeout = self.timeout_s if timeout_s is None else timeout_s
        session = await connection.connected()
        await connection.await_identity(session, timeout)
        if not session.alive:
            session = await connection.connected()
            await connection.await_identity(session, timeout)
        info = session.info
        if info is None:
            raise ConnectionLost(f"connection to node {self.address} lost before it said who it is")
        return info

    async def info(self, *, timeout_s: float | None = None) -> NodeInfo:
        """What the node says about itself (also a ping)."""
        request_id = self._connection.new_id()
        response = await call_one(
            self._connection, encode_request(Info(request_id)), request_id, timeout_s, InfoResponse
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
    how a byte stream to the address is opened (TCP, through TLS if asked, by
    default): an in-memory stream, say.
    """
    with lone_error_unwrapped():
        async with anyio.create_task_group() as task_group:
            connection = NodeConnection(
                address,
                task_group,
                timeout_s=timeout_s,
                connect_timeout_s=connect_timeout_s,
                inflight_max=inflight_max,
                inflight_bytes_max=inflight_bytes_max,
                frame_bytes_max=frame_bytes_max,
                reconnect_attempts=reconnect_attempts,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=backoff_max_s,
                open_stream=open_stream or tcp_opener(_ssl_context(tls, tls_ca_file)),
            )
            client = NodeClient(connection)
            try:
                await client.start()
                yield client
            finally:
                await client.aclose()


__all__ = ["NodeClient", "NodeInfo", "connect_node", "error_from_response"]
