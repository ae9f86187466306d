"""The node's registration in the cluster's metadata store: the one owner of it.

`NodeRegistrar` registers the node once it serves (`register`), keeps the lease alive
while it runs (`run`: a renew every third of the lease, an update when the node's
read-only state or free space changes, and nothing more), and removes the
registration on a clean stop (`unregister`). With each renewal it also raises the
instance's mark to the journal's durable position, when that moved, through its
owner `NodeMark` (node_mark.py; membership.py says what the mark is for). It only
ever talks to the `MetadataStore` interface, so it behaves the same on SQLite and
ZooKeeper.

A store outage must not stop a node serving: a failed renew is logged and tried
again at the next tick (but a store whose file was removed or replaced,
`MetadataStoreGone`, ends the renewals, logged as an error: nothing written there is
seen by any other process); a registration found gone (`RegistrationLost`: the lease ran
out during the outage) is registered again; if meanwhile another live instance took
the address (`NodeAddressTaken`), the node keeps serving, counts it, logs an error
every `TAKEN_LOG_INTERVAL_S`, and keeps trying.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Final

import trio

from pora.meta.backends import open_metadata
from pora.meta.config import MetadataConfig
from pora.meta.errors import (
    MetadataError,
    MetadataStoreGone,
    MetadataUnavailable,
    NodeAddressTaken,
    RegistrationLost,
)
from pora.meta.records import NodeRegistration
from pora.meta.store import MetadataStore
from pora.server.diskwatch import ReadOnlySwitch
from pora.server.node_mark import NodeMark
from pora.server.settings import Address, Settings

_log = logging.getLogger("pora.registration")

#: how often a node whose address another instance holds says so again
TAKEN_LOG_INTERVAL_S: Final = 30.0
#: free space moves this much (of the registered figure) before the record is updated
FREE_BYTES_CHANGE_FRACTION: Final = 0.05
#: ... and never for less than this many bytes
FREE_BYTES_CHANGE_MIN: Final = 64 << 20


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the registration says about the node besides its address."""

    read_only: bool
    free_bytes: int


@dataclass(slots=True)
class RegistrationStatus:
    """For metrics and logs: whether the node is registered, and what went wrong."""

    url: str
    address: str
    registered: bool = False
    renew_failures: int = 0
    address_taken: int = 0
    reregistrations: int = 0


class NodeRegistrar:
    def __init__(
        self,
        store: MetadataStore,
        address: str,
        instance_id: str,
        rack: str | None,
        lease_s: float,
        node_state: Callable[[], NodeState],
        mark: NodeMark | None = None,
    ) -> None:
        self.store = store
        #: the instance's mark, raised with each renewal (None: no mark kept)
        self.mark = mark
        self.address = address
        self.instance_id = instance_id
        self.rack = rack
        self.lease_s = lease_s
        self.node_state = node_state
        self.status = RegistrationStatus(store.url, address)
        #: what the store holds, as far as this node knows
        self._registered_state: NodeState | None = None
        self._changed = trio.Event()
        self._taken_logged_at = float("-inf")
        self._run_scope = trio.CancelScope()
        self._run_done = trio.Event()
        self._run_started = False

    def _registration(self, state: NodeState) -> NodeRegistration:
        return NodeRegistration(
            address=self.address,
            instance_id=self.instance_id,
            read_only=state.read_only,
            free_bytes=state.free_bytes,
            rack=self.rack,
        )

    async def register(self) -> None:
        """Register (or take back this instance's own registration); NodeAddressTaken
        if another live instance holds the address."""
        state = self.node_state()
        await self.store.register_node(self._registration(state), self.lease_s)
        self._registered_state = state
        self.status.registered = True
        _log.info(
            "registered as %s in %s (lease %.1fs)",
            self.address,
            self.store.url,
            self.lease_s,
            extra={"fields": {"address": self.address, "instance_id": self.instance_id,
                              "metadata": self.store.url}},
        )  # fmt: skip

    def node_changed(self) -> None:
        """The node's read-only state changed: update the registration now."""
        self._changed.set()

    async def run(self) -> None:
        """Keep the registration alive and current until cancelled."""
        interval_s = self.lease_s / 3
        self._run_started = True
        try:
            with self._run_scope:
                while True:
                    with trio.move_on_after(interval_s):
                        await self._changed.wait()
                    self._changed = trio.Event()
                    try:
                        await self.tick()
                    except MetadataStoreGone as error:
                        # renewing in a file no other process opens would keep this
                        # node listed nowhere anyone looks: stop, and say why
                        self.status.registered = False
                        _log.error("%s stops renewing its registration: %s", self.address, error)
                        return
        finally:
            self._run_done.set()

    async def tick(self) -> None:
        """One renewal: update the record if the node's state moved, else renew."""
        try:
            if self.status.registered:
                await self._renew_or_update()
            else:
                await self._register_again()
        except RegistrationLost:
            self.status.registered = False
            _log.warning(
                "registration of %s in %s was lost (its lease ran out): registering again",
                self.address,
                self.store.url,
            )
            await self._register_again()
        await self._advance_mark()

    async def _advance_mark(self) -> None:
        """Raise the instance's mark to where the journal is durable now: a copy of the
        data dir taken before this write is found behind the mark when it is put back."""
        if self.mark is None:
            return
        try:
            await self.mark.advance()
        except MetadataError as error:
            self._warn_retrying(f"cannot raise the mark of {self.instance_id}", error)

    async def _renew_or_update(self) -> None:
        try:
            state = self.node_state()
            if self._needs_update(state):
                # an update does not extend a lease on every backend: renew as well
                await self.store.update_registration(self._registration(state))
                self._registered_state = state
            await self.store.renew_node(self.address, self.instance_id, self.lease_s)
        except (RegistrationLost, MetadataStoreGone):
            raise
        except MetadataError as error:
            self.status.renew_failures += 1
            self._warn_retrying(f"cannot renew the registration of {self.address}", error)

    def _warn_retrying(self, what: str, error: MetadataError) -> None:
        _log.warning(
            "%s: %s (trying again in %.1fs; the node keeps serving)",
            what,
            error,
            self.lease_s / 3,
            extra={"fields": {"error": type(error).__name__}},
        )

    async def _register_again(self) -> None:
        try:
            await self.register()
        except NodeAddressTaken as error:
            self.status.address_taken += 1
            now = time.monotonic()
            if now - self._taken_logged_at >= TAKEN_LOG_INTERVAL_S:
                self._taken_logged_at = now
                _log.error(
                    "this node serves but is not registered: %s (metadata store %s; "
                    "retrying every %.1fs)",
                    error,
                    self.store.url,
                    self.lease_s / 3,
                    extra={"fields": {"error": "NodeAddressTaken"}},
                )
        except MetadataStoreGone:
            raise
        except MetadataError as error:
            self.status.renew_failures += 1
            _log.warning(
                "cannot register %s again: %s (trying again in %.1fs)",
                self.address,
                error,
                self.lease_s / 3,
            )
        else:
            self.status.reregistrations += 1

    def _needs_update(self, state: NodeState) -> bool:
        registered = self._registered_state
        if registered is None or registered.read_only != state.read_only:
            return True
        moved = abs(state.free_bytes - registered.free_bytes)
        return moved >= max(
            FREE_BYTES_CHANGE_MIN, registered.free_bytes * FREE_BYTES_CHANGE_FRACTION
        )

    async def unregister(self) -> None:
        """Raise the mark a last time and remove the registration (the node has stopped
        taking work); a failure is logged, and the lease then runs out by itself.
        Stops `run` first, so no renew or re-registration can follow the removal."""
        self._run_scope.cancel()
        if self._run_started:
            await self._run_done.wait()
        # the requests have drained: this mark covers every acknowledgement the node
        # sent, so a copy of the data dir taken before now is caught when put back
        await self._advance_mark()
        if not self.status.registered:
            return
        try:
            await self.store.unregister_node(self.address, self.instance_id)
        except MetadataError as error:
            _log.warning(
                "cannot unregister %s from %s: %s (the registration expires within %.1fs)",
                self.address,
                self.store.url,
                error,
                self.lease_s,
            )
            return
        self.status.registered = False
        _log.info("unregistered %s from %s", self.address, self.store.url)


# --- the daemon's side: opening the store, the advertised address, read-only news ------


WILDCARD_HOSTS: Final = ("0.0.0.0", "::", "")
#: the shortest time a metadata call is given, whatever the lease
CALL_TIMEOUT_MIN_S: Final = 2.0


class RegistrationRefused(MetadataError):
    """The node cannot register as configured: `pora serve` exits 2 with this line."""


def check_advertisable(settings: Settings) -> None:
    """Refuse, before anything starts, a node that would register an address no
    client can reach."""
    if settings.metadata is None or settings.advertise is not None:
        return
    if settings.listen.host in WILDCARD_HOSTS:
        raise RegistrationRefused(
            f"--listen {settings.listen} is a wildcard address, which clients cannot "
            f"connect to: give the address to register in {settings.metadata} with "
            "--advertise HOST:PORT (PORA_ADVERTISE)"
        )


def advertised_address(settings: Settings, bound: tuple[str, int]) -> str:
    if settings.advertise is not None:
        return str(settings.advertise)
    host, port = bound
    return str(Address(host, port))


@asynccontextmanager
async def open_registration_store(settings: Settings) -> AsyncIterator[MetadataStore | None]:
    """The metadata store `--metadata` names (None when the node runs standalone); an
    unreachable store refuses the start with the store's own message."""
    if settings.metadata is None:
        yield None
        return
    # a call that outlives the lease cannot keep it: give up on each well before, but
    # leave a loaded machine's SQLite (or a ZooKeeper round trip) a fair chance
    timeout_s = min(
        MetadataConfig.call_timeout_s,
        max(CALL_TIMEOUT_MIN_S, settings.registration_lease_s / 2),
    )
    async with AsyncExitStack() as stack:
        try:
            store = await stack.enter_async_context(
                open_metadata(
                    settings.metadata,
                    # ZooKeeper keeps the registration as long as the session: the same
                    # lifetime after the node is gone as SQLite's lease
                    MetadataConfig(
                        call_timeout_s=timeout_s,
                        session_timeout_s=settings.registration_lease_s,
                    ),
                )
            )
        except MetadataUnavailable as error:
            raise RegistrationRefused(
                f"cannot register the node: {error}. Check that the store is up and the "
                "URL is right (--metadata), or run without --metadata for a standalone node"
            ) from None
        yield store


async def register_node(
    store: MetadataStore,
    settings: Settings,
    instance_id: str,
    address: str,
    node_state: Callable[[], NodeState],
    mark: NodeMark | None = None,
) -> NodeRegistrar:
    """Register the node, which serves already; the refusals the operator must act on
    are raised as RegistrationRefused."""
    registrar = NodeRegistrar(
        store,
        address,
        instance_id,
        settings.rack,
        settings.registration_lease_s,
        node_state,
        mark,
    )
    try:
        await registrar.register()
    except NodeAddressTaken as error:
        raise RegistrationRefused(
            f"cannot register the node in {store.url}: address {error.address} is held by "
            f"the live node instance {error.holder_instance_id}, not this data dir's "
            f"({instance_id}). Stop that node (a clean stop frees the address at once; "
            "a killed node's lease runs out by itself) or serve this one on another "
            "address (--listen, --advertise)"
        ) from None
    except MetadataUnavailable as error:
        raise RegistrationRefused(
            f"cannot register the node: {error}. Check that the store is up (--metadata)"
        ) from None
    return registrar


class ReadOnlyNotifier:
    """Stands between the disk monitor and the node: passes each read-only switch on,
    and tells the registrar, which updates the registration at once."""

    def __init__(self, node: ReadOnlySwitch) -> None:
        self.node = node
        self.listener: Callable[[], None] | None = None

    @property
    def read_only(self) -> str | None:
        return self.node.read_only

    def set_read_only(self, reason: str | None) -> None:
        was = self.node.read_only is not None
        self.node.set_read_only(reason)
        if self.listener is not None and was != (reason is not None):
            self.listener()
