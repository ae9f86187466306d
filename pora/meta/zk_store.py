"""The ZooKeeper metadata store (kazoo): ledger records in a bucketed znode tree,
versions from znode stats, node registrations as ephemeral znodes kept by the
client's session, documents under /documents/<space>/<escaped name>. kazoo's
`*_async` calls only queue a request for its connection thread, so the single-request
operations (create, read, update, delete) send from the event loop and are woken by
kazoo's completion callback: no worker thread per call. Multi-step operations (id
blocks, listings, registrations) run in a worker thread (at most
`MetadataConfig.threads_max`). Nothing blocks the event loop. docs/metadata.md gives
the layout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from functools import partial
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import sniffio
import trio
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from pora.meta.config import DEFAULT_LEASE_S, MetadataConfig
from pora.meta.documents import (
    check_document_data,
    check_document_key,
    check_page,
    check_version,
    document_key,
    key_of_znode,
    page_of,
)
from pora.meta.errors import (
    DocumentExists,
    LedgerExists,
    MetadataError,
    MetadataTimeout,
    MetadataUnavailable,
    MetadataVersionConflict,
    NoSuchDocument,
    NoSuchLedgerMetadata,
)
from pora.meta.identity import check_node_mark, new_cluster_id
from pora.meta.locks import check_lock
from pora.meta.records import LedgerMetadata, NodeRegistration, Versioned
from pora.meta.zk_layout import (
    LAYOUT_VERSION,
    ZNODE_DATA_BYTES_MAX,
    ZkPaths,
    bucket_of,
    parse_zk_url,
)
from pora.meta.zk_locks import ZkLocks
from pora.meta.zk_registry import ZkRegistry

R = TypeVar("R")

#: a request whose outcome is unknown: the connection or the session broke under it
UNKNOWN_OUTCOME = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, KazooTimeoutError)
RECONNECT_DELAY_MAX_S = 1.0
#: pause before a read cut off by a lost connection is sent again
READ_RETRY_PAUSE_S = 0.02
#: opening a store waits for a server this share of the call timeout
CONNECT_SHARE_OF_TIMEOUT = 0.9

Wake = Callable[[Callable[[], object]], object]


def _loop_waker() -> Wake:
    """A thread-safe, non-blocking way to run a function on this task's event loop."""
    if sniffio.current_async_library() == "trio":
        return trio.lowlevel.current_trio_token().run_sync_soon
    return asyncio.get_running_loop().call_soon_threadsafe


class ZooKeeperMetadataStore:
    def __init__(self, url: str, config: MetadataConfig) -> None:
        self._url = url
        self._config = config
        self._hosts, chroot = parse_zk_url(url)
        self.paths = ZkPaths(chroot)
        self._limiter = anyio.CapacityLimiter(config.threads_max)
        self._record_limit = min(config.record_bytes_max, ZNODE_DATA_BYTES_MAX)
        self._closed = False
        self._id_lock = anyio.Lock()
        self._next_id = 0
        self._block_end = 0
        self.client = KazooClient(
            hosts=self._hosts,
            timeout=config.session_timeout_s,
            # reconnect forever, quickly: the session (and its registrations) may still
            # be alive on the servers
            connection_retry=KazooRetry(
                max_tries=-1, delay=0.05, max_delay=RECONNECT_DELAY_MAX_S, max_jitter=0.1
            ),
        )
        self._registry = ZkRegistry(self.client, self.paths, self._wait)
        self._locks = ZkLocks(self.client, self.paths.locks, self.paths.lock, self._wait)
        self.client.add_listener(self._on_state)

    @property
    def url(self) -> str:
        return self._url

    @classmethod
    async def open(
        cls, url: str, config: MetadataConfig, *, create: bool
    ) -> ZooKeeperMetadataStore:
        store = cls(url, config)
        try:
            await store._call(store._connect, checked=False)
            await store._call(store._create_layout if create else store._check_layout)
        except BaseException:
            await store.aclose()
            raise
        return store

    # --- connection, threads, errors

    def _connect(self) -> None:
        # within the call's own timeout, so that this message, not the call's, says why
        start_timeout_s = self._config.call_timeout_s * CONNECT_SHARE_OF_TIMEOUT
        try:
            self.client.start(timeout=start_timeout_s)
        except KazooTimeoutError:
            raise MetadataUnavailable(
                self._url,
                f"no ZooKeeper server answered within {start_timeout_s:g} s",
                f"is ZooKeeper running at {self._hosts}? check the URL's host list "
                f"(the chroot {self.paths.root} is created if missing)",
            ) from None

    def _create_layout(self) -> None:
        for path in self.paths.persistent():
            self.client.ensure_path(path)
        with contextlib.suppress(NodeExistsError):
            self._wait(self.client.create_async(self.paths.id_counter, b"0"))
        layout = json.dumps({"layout_version": LAYOUT_VERSION}).encode()
        try:
            self._wait(self.client.create_async(self.paths.layout, layout))
        except NodeExistsError:
            self._check_layout()

    def _check_layout(self) -> None:
        """The chroot holds a store of this layout version (written last when a store
        is set up, so the rest is in place); MetadataUnavailable if it holds none."""
        try:
            data, _ = self._wait(self.client.get_async(self.paths.layout))
        except NoNodeError:
            raise MetadataUnavailable(
                self._url,
                f"no store under the chroot {self.paths.root} ({self.paths.layout} is missing)",
                "a store is set up by the nodes: `pora cluster` or `pora serve --metadata "
                "URL`; check the URL's chroot",
            ) from None
        found = json.loads(data).get("layout_version")
        if found != LAYOUT_VERSION:
            raise MetadataUnavailable(
                self._url,
                f"layout version {found} at {self.paths.layout} is not {LAYOUT_VERSION}",
                "use the Pora version that wrote it, or another chroot",
            )

    def _wait(self, result: Any) -> Any:  # kazoo has no type hints
        """Wait (in a worker thread) for one of kazoo's async results."""
        return result.get(timeout=self._config.call_timeout_s)

    def _in_thread(self, operation: Callable[[], R], retry_reads: bool) -> R:
        deadline = time.monotonic() + self._config.call_timeout_s
        while True:
            try:
                return operation()
            except MetadataError:
                raise
            except ConnectionClosedError as error:
                raise MetadataError(f"metadata store {self._url} is closed") from error
            except UNKNOWN_OUTCOME as error:
                # a read is safe to send again once kazoo has reconnected
                if retry_reads and time.monotonic() < deadline:
                    continue
                raise MetadataTimeout(
                    self._url,
                    f"ZooKeeper request failed: {type(error).__name__}",
                    f"is ZooKeeper running at {self._hosts}? a write may or may not have "
                    "happened: read the record again",
                ) from error
            except KazooException as error:
                raise MetadataUnavailable(
                    self._url, f"ZooKeeper refused a request: {error!r}", "see the server's log"
                ) from error

    async def _call(
        self, operation: Callable[[], R], retry_reads: bool = False, checked: bool = True
    ) -> R:
        if checked and self._closed:
            raise MetadataError(f"metadata store {self._url} is closed")
        timeout = self._config.call_timeout_s
        try:
            with anyio.fail_after(timeout):
                # abandoned on timeout: the thread's own waits end within the timeout
                return await anyio.to_thread.run_sync(
                    self._in_thread, operation, retry_reads,
                    limiter=self._limiter, abandon_on_cancel=True,
                )  # fmt: skip
        except TimeoutError:
            raise MetadataTimeout(
                self._url,
                f"no answer within {timeout:g} s",
                f"is ZooKeeper running at {self._hosts}? a write may or may not have happened",
            ) from None

    async def _request(self, send: Callable[[], Any], *, read: bool) -> Any:
        """Send one kazoo request from the event loop and wait for its answer there. A
        read cut off by a lost connection is sent again until the call's deadline; a
        write's outcome is then unknown (MetadataTimeout). ZooKeeper's own refusals
        (BadVersionError, NoNodeError, NodeExistsError) reach the caller as they are."""
        if self._closed:
            raise MetadataError(f"metadata store {self._url} is closed")
        timeout = self._config.call_timeout_s
        deadline = anyio.current_time() + timeout
        wake = _loop_waker()
        while True:
            result = send()
            answered = anyio.Event()

            def on_answer(_result: object, answered: anyio.Event = answered) -> None:
                # kazoo's completion thread; the caller's loop may have ended meanwhile
                with contextlib.suppress(RuntimeError):
                    wake(answered.set)

            result.rawlink(on_answer)
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
                await answered.wait()
            if not answered.is_set():
                raise MetadataTimeout(
                    self._url,
                    f"no answer within {timeout:g} s",
                    f"is ZooKeeper running at {self._hosts}? a write may or may not have "
                    "happened: read the record again",
                )
            try:
                return result.get_nowait()
            except ConnectionClosedError as error:
                raise MetadataError(f"metadata store {self._url} is closed") from error
            except UNKNOWN_OUTCOME as error:
                if read and anyio.current_time() + READ_RETRY_PAUSE_S < deadline:
                    await anyio.sleep(READ_RETRY_PAUSE_S)
                    continue
                raise MetadataTimeout(
                    self._url,
                    f"ZooKeeper request failed: {type(error).__name__}",
                    f"is ZooKeeper running at {self._hosts}? a write may or may not have "
                    "happened: read the record again",
                ) from error
            except (BadVersionError, NoNodeError, NodeExistsError):
                raise
            except KazooException as error:
                raise MetadataUnavailable(
                    self._url, f"ZooKeeper refused a request: {error!r}", "see the server's log"
                ) from error

    def _on_state(self, state: str) -> None:
        # runs on kazoo's connection thread: no request may be sent from here
        if state == KazooState.LOST:
            self._registry.session_lost()
        elif state == KazooState.CONNECTED:
            self._registry.connected(self.client.handler.spawn)

    async def aclose(self) -> None:
        """Close the session; the registrations this store made disappear with it."""
        if self._closed:
            return
        self._closed = True

        def stop() -> None:
            self.client.stop()
            # a start that timed out has stopped and closed the client already, and
            # kazoo refuses a second close
            with contextlib.suppress(Exception):
                self.client.close()

        with anyio.move_on_after(self._config.call_timeout_s), anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(stop, abandon_on_cancel=True)

    # --- ledger ids

    async def allocate_ledger_id(self) -> int:
        async with self._id_lock:
            if self._next_id >= self._block_end:
                block = self._config.id_block_size
                start = await self._call(partial(self._reserve_ids, block))
                self._next_id, self._block_end = start, start + block
            ledger_id = self._next_id
            self._next_id += 1
            return ledger_id

    def _reserve_ids(self, block: int) -> int:
        # compare-and-set on the counter's version; a conflict means another process
        # reserved a block first: read again and retry
        while True:
            data, stat = self._wait(self.client.get_async(self.paths.id_counter))
            start = int(data)
            try:
                self._wait(
                    self.client.set_async(
                        self.paths.id_counter, str(start + block).encode(), stat.version
                    )
                )
            except BadVersionError:
                continue
            return start

    # --- ledger metadata

    async def create_ledger(self, meta: LedgerMetadata) -> Versioned[LedgerMetadata]:
        record = meta.encode(self._record_limit)
        path = self.paths.ledger(meta.ledger_id)

        try:
            await self._request(
                partial(self.client.create_async, path, record, makepath=True), read=False
            )
        except NodeExistsError:
            raise LedgerExists(meta.ledger_id) from None
        return Versioned(meta, 0)

    def _read(
        self, path: str, watch: Callable[[object], None] | None = None
    ) -> Versioned[bytes] | None:
        try:
            data, stat = self._wait(self.client.get_async(path, watch))
        except NoNodeError:
            return None
        return Versioned(bytes(data), int(stat.version))

    async def _read_async(self, path: str) -> Versioned[bytes] | None:
        try:
            data, stat = await self._request(partial(self.client.get_async, path), read=True)
        except NoNodeError:
            return None
        return Versioned(bytes(data), int(stat.version))

    async def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        found = await self._read_async(self.paths.ledger(ledger_id))
        if found is None:
            raise NoSuchLedgerMetadata(ledger_id)
        return Versioned(LedgerMetadata.decode(found.value), found.version)

    async def _conflict(self, ledger_id: int, expected: int) -> MetadataError:
        found = await self._read_async(self.paths.ledger(ledger_id))
        if found is None:
            return NoSuchLedgerMetadata(ledger_id)
        return MetadataVersionConflict(f"ledger {ledger_id}", expected, found.version)

    async def update_ledger(
        self, meta: LedgerMetadata, expected_version: int
    ) -> Versioned[LedgerMetadata]:
        record = meta.encode(self._record_limit)
        path = self.paths.ledger(meta.ledger_id)

        try:
            stat = await self._request(
                partial(self.client.set_async, path, record, expected_version), read=False
            )
        except BadVersionError:
            raise await self._conflict(meta.ledger_id, expected_version) from None
        except NoNodeError:
            raise NoSuchLedgerMetadata(meta.ledger_id) from None
        return Versioned(meta, int(stat.version))

    async def delete_ledger(self, ledger_id: int, expected_version: int) -> None:
        path = self.paths.ledger(ledger_id)

        try:
            await self._request(
                partial(self.client.delete_async, path, expected_version), read=False
            )
        except BadVersionError:
            raise await self._conflict(ledger_id, expected_version) from None
        except NoNodeError:
            raise NoSuchLedgerMetadata(ledger_id) from None

    def _page(self, after_id: int, limit: int) -> list[Versioned[bytes]]:
        buckets = sorted(self._wait(self.client.get_children_async(self.paths.ledgers)))
        first_bucket = bucket_of(max(after_id, 0))
        records: list[Versioned[bytes]] = []
        for bucket in buckets:
            if int(bucket) < first_bucket:
                continue
            try:
                names = self._wait(self.client.get_children_async(f"{self.paths.ledgers}/{bucket}"))
            except NoNodeError:
                continue
            ids = sorted(i for i in map(int, names) if i > after_id)
            # read the page's records in parallel: one round trip, not one per record
            pending = [
                self.client.get_async(self.paths.ledger(i)) for i in ids[: limit - len(records)]
            ]
            for result in pending:
                try:
                    data, stat = self._wait(result)
                except NoNodeError:
                    continue  # deleted since the listing
                records.append(Versioned(bytes(data), int(stat.version)))
            if len(records) >= limit:
                break
        return records

    async def list_ledgers(
        self, after_id: int = -1, limit: int = 1000
    ) -> list[Versioned[LedgerMetadata]]:
        page = await self._call(partial(self._page, after_id, limit), retry_reads=True)
        return [Versioned(LedgerMetadata.decode(r.value), r.version) for r in page]

    async def watch_ledger(
        self, ledger_id: int, after_version: int | None = None
    ) -> AsyncIterator[Versioned[LedgerMetadata]]:
        changes = self._watch(
            self.paths.ledger(ledger_id), after_version, lambda: NoSuchLedgerMetadata(ledger_id)
        )
        # closed with the watch, not left to the garbage collector
        async with aclosing(changes):
            async for found in changes:
                yield Versioned(LedgerMetadata.decode(found.value), found.version)

    async def _watch(
        self, path: str, after_version: int | None, missing: Callable[[], MetadataError]
    ) -> AsyncGenerator[Versioned[bytes], None]:
        """Yield the znode's data each time its version moves past the last one
        yielded (from `after_version`, or the version at the start); end when it is
        deleted; `missing()` if it is absent at the start."""
        first = await self._call(partial(self._read, path), retry_reads=True)
        if first is None:
            raise missing()
        seen = first.version if after_version is None else after_version
        token = anyio.lowlevel.current_token()
        while True:
            changed = anyio.Event()

            def fire(_event: object, changed: anyio.Event = changed) -> None:
                # kazoo's callback thread: wake the event loop, which may be gone
                try:
                    anyio.from_thread.run_sync(changed.set, token=token)
                except Exception:  # the watcher's event loop has ended
                    return

            # each read arms a new data watch; kazoo also fires it when the
            # connection drops, so the loop reads again after a reconnect
            found = await self._call(partial(self._read, path, fire), retry_reads=True)
            if found is None:
                return
            if found.version > seen:
                seen = found.version
                yield found
                continue
            # a lost notification costs at most one call timeout of delay
            with anyio.move_on_after(self._config.call_timeout_s):
                await changed.wait()

    # --- documents (docs/metadata.md: /documents/<space>/<escaped name>)

    async def create_document(self, space: str, name: str, data: bytes) -> Versioned[bytes]:
        check_document_key(space, name)
        data = check_document_data(space, name, data, self._record_limit)
        path = self.paths.document(space, name)
        try:
            # makepath: the documents znode and the space's are made on demand
            await self._request(
                partial(self.client.create_async, path, data, makepath=True), read=False
            )
        except NodeExistsError:
            raise DocumentExists(space, name) from None
        return Versioned(data, 0)

    async def read_document(self, space: str, name: str) -> Versioned[bytes]:
        check_document_key(space, name)
        found = await self._read_async(self.paths.document(space, name))
        if found is None:
            raise NoSuchDocument(space, name)
        return found

    async def _document_refusal(self, space: str, name: str, expected: int) -> MetadataError:
        found = await self._read_async(self.paths.document(space, name))
        if found is None:
            return NoSuchDocument(space, name)
        return MetadataVersionConflict(document_key(space, name), expected, found.version)

    async def update_document(
        self, space: str, name: str, data: bytes, expected_version: int
    ) -> Versioned[bytes]:
        check_document_key(space, name)
        data = check_document_data(space, name, data, self._record_limit)
        expected = check_version(space, name, expected_version)
        path = self.paths.document(space, name)
        try:
            stat = await self._request(
                partial(self.client.set_async, path, data, expected), read=False
            )
        except BadVersionError:
            raise await self._document_refusal(space, name, expected) from None
        except NoNodeError:
            raise NoSuchDocument(space, name) from None
        return Versioned(data, int(stat.version))

    async def delete_document(self, space: str, name: str, expected_version: int) -> None:
        check_document_key(space, name)
        expected = check_version(space, name, expected_version)
        path = self.paths.document(space, name)
        try:
            await self._request(partial(self.client.delete_async, path, expected), read=False)
        except BadVersionError:
            raise await self._document_refusal(space, name, expected) from None
        except NoNodeError:
            raise NoSuchDocument(space, name) from None

    async def list_documents(self, space: str, after: str = "", limit: int = 1000) -> list[str]:
        check_page(space, after, limit)
        try:
            children = await self._request(
                partial(self.client.get_children_async, self.paths.document_space(space)),
                read=True,
            )
        except NoNodeError:
            return []  # no document was ever created in this space
        return page_of([key_of_znode(child) for child in children], after, limit)

    async def watch_document(
        self, space: str, name: str, after_version: int | None = None
    ) -> AsyncIterator[Versioned[bytes]]:
        # checked on the first step, as every error of a watch is (the SQLite one too)
        check_document_key(space, name)
        changes = self._watch(
            self.paths.document(space, name), after_version, lambda: NoSuchDocument(space, name)
        )
        # closed with the watch, not left to the garbage collector
        async with aclosing(changes):
            async for document in changes:
                yield document

    # --- node registry (ephemeral znodes; see ZkRegistry)

    async def register_node(
        self, registration: NodeRegistration, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        registration.validate()
        if lease_s <= 0:
            raise MetadataError(f"a lease must be positive, not {lease_s} s")
        await self._call(partial(self._registry.register, registration))

    async def renew_node(
        self, address: str, instance_id: str, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        await self._call(partial(self._registry.renew, address, instance_id))

    async def update_registration(self, registration: NodeRegistration) -> None:
        registration.validate()
        await self._call(
            partial(self._registry.renew, registration.address, registration.instance_id,
                    registration),
        )  # fmt: skip

    async def unregister_node(self, address: str, instance_id: str) -> None:
        await self._call(partial(self._registry.unregister, address, instance_id))

    async def list_nodes(self, writable_only: bool = False) -> list[NodeRegistration]:
        nodes = await self._call(self._registry.list_all, retry_reads=True)
        return [n for n in nodes if not (writable_only and (n.read_only or n.draining))]

    # --- locks: ephemeral znodes of this session (ZkLocks); the lease is the session's

    async def acquire_lock(self, name: str, holder: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
        check_lock(name, holder, lease_s)
        return await self._call(partial(self._locks.acquire, name, holder))

    async def renew_lock(self, name: str, holder: str, lease_s: float = DEFAULT_LEASE_S) -> None:
        check_lock(name, holder, lease_s)
        await self._call(partial(self._locks.renew, name, holder), retry_reads=True)

    async def release_lock(self, name: str, holder: str) -> None:
        check_lock(name, holder)
        await self._call(partial(self._locks.release, name, holder))

    # --- the cluster's identity and the nodes' marks

    async def cluster_id(self) -> str | None:
        try:
            data, _ = await self._request(
                partial(self.client.get_async, self.paths.cluster), read=True
            )
        except NoNodeError:
            return None
        return self._decode_cluster(bytes(data))

    def _decode_cluster(self, data: bytes) -> str:
        try:
            found = json.loads(data)["cluster_id"]
        except (ValueError, KeyError, TypeError) as error:
            raise MetadataUnavailable(
                self._url,
                f"{self.paths.cluster} is damaged ({error!r}): it holds {data[:80]!r}",
                'it should be JSON {"cluster_id": ...}; restore it, or use another chroot',
            ) from None
        return str(found)

    async def initialize_cluster(self) -> str:
        record = json.dumps(
            {"cluster_id": new_cluster_id(), "created_ms": time.time_ns() // 1_000_000}
        ).encode()
        try:
            await self._request(
                partial(self.client.create_async, self.paths.cluster, record), read=False
            )
        except NodeExistsError:
            pass  # set up by another process first: its id is the cluster's
        except MetadataTimeout:
            # the create may have happened: whichever id is stored is the answer
            found = await self.cluster_id()
            if found is None:
                raise
            return found
        found = await self.cluster_id()
        if found is None:
            raise MetadataUnavailable(
                self._url,
                f"{self.paths.cluster} disappeared right after it was created",
                "something else deletes znodes under this chroot",
            )
        return found

    async def node_mark(self, instance_id: str) -> int | None:
        check_node_mark(instance_id, 0)
        try:
            data, _ = await self._request(
                partial(self.client.get_async, self.paths.mark(instance_id)), read=True
            )
        except NoNodeError:
            return None
        return int(json.loads(data)["mark"])

    async def advance_node_mark(self, instance_id: str, mark: int) -> None:
        check_node_mark(instance_id, mark)
        await self._call(partial(self._advance_mark, instance_id, mark))

    def _advance_mark(self, instance_id: str, mark: int) -> None:
        path = self.paths.mark(instance_id)
        record = json.dumps({"mark": mark}).encode()
        # compare-and-set on the znode's version: a mark never goes back, even with
        # two processes of one instance writing (a node and its stale twin)
        while True:
            try:
                data, stat = self._wait(self.client.get_async(path))
            except NoNodeError:
                try:
                    self._wait(self.client.create_async(path, record, makepath=True))
                except NodeExistsError:
                    continue
                return
            if int(json.loads(data)["mark"]) >= mark:
                return
            try:
                self._wait(self.client.set_async(path, record, stat.version))
            except BadVersionError:
                continue
            return
