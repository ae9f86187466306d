"""Node registrations in ZooKeeper: one ephemeral znode per address, holding the
`NodeRegistration` JSON and kept alive by the registering store's session.

A store remembers the registrations it made. When its session expires (ZooKeeper
dropped the ephemeral znodes) and kazoo connects again with a new session, a
connection-state listener re-creates them from a kazoo worker thread; `renew_node`
also re-creates a missing one, in case that re-creation failed. Every method here but
the two listener hooks runs in a worker thread of the store."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from pora.meta.documents import NODE_DRAINING_SPACE, key_of_znode
from pora.meta.errors import MetadataError, NodeAddressTaken, RegistrationLost
from pora.meta.records import NodeRegistration
from pora.meta.zk_layout import ZkPaths

log = logging.getLogger(__name__)

#: create/read/delete rounds against other sessions changing the same znode
CONTENDED_ATTEMPTS = 5
Wait = Callable[[Any], Any]  # kazoo has no type hints
Spawn = Callable[..., object]


def _now_ms() -> int:
    return int(time.time() * 1000)


class ZkRegistry:
    def __init__(self, client: KazooClient, paths: ZkPaths, wait: Wait) -> None:
        self._client = client
        self._paths = paths
        self._wait = wait
        self._lock = threading.Lock()
        #: held through each whole register, renew or unregister: a call abandoned by
        #: its cancelled caller goes on in its thread, and must not re-create a
        #: registration that an unregister made after it removes
        self._operations = threading.RLock()
        self._held: dict[str, NodeRegistration] = {}
        self._session_lost = False

    def _session_id(self) -> int | None:
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    def _get(self, address: str) -> tuple[NodeRegistration, int, int] | None:
        """The registration at `address`, its znode version and its owning session."""
        try:
            data, stat = self._wait(self._client.get_async(self._paths.node(address)))
        except NoNodeError:
            return None
        return NodeRegistration.decode(data), int(stat.version), int(stat.ephemeralOwner)

    def _take(self, registration: NodeRegistration) -> NodeRegistration:
        """Hold `registration`'s address in this session: create its ephemeral znode,
        or replace one the same instance id left behind (an old session not yet
        expired); NodeAddressTaken if another instance id holds it."""
        fresh = replace(registration, last_seen_ms=_now_ms())
        path = self._paths.node(registration.address)
        for _ in range(CONTENDED_ATTEMPTS):
            try:
                self._wait(self._client.create_async(path, fresh.encode(), ephemeral=True))
            except NodeExistsError:
                pass
            else:
                return fresh
            found = self._get(registration.address)
            if found is None:
                continue  # gone since the create: try again
            holder, version, owner = found
            if holder.instance_id != registration.instance_id:
                raise NodeAddressTaken(registration.address, holder.instance_id, None)
            try:
                if owner == self._session_id():
                    self._wait(self._client.set_async(path, fresh.encode(), version))
                    return fresh
                self._wait(self._client.delete_async(path, version))
            except (NoNodeError, BadVersionError):
                continue
        raise MetadataError(
            f"node {registration.address}: its registration znode kept changing under "
            f"{CONTENDED_ATTEMPTS} attempts; is another process registering the same address?"
        )

    def register(self, registration: NodeRegistration) -> None:
        with self._operations:
            taken = self._take(registration)
            with self._lock:
                self._held[registration.address] = taken

    def renew(
        self, address: str, instance_id: str, replacement: NodeRegistration | None = None
    ) -> None:
        """Refresh `last_seen_ms` (and the fields of `replacement`); re-create the znode
        if this store's session lost it; RegistrationLost if another instance has it or
        this store never held it."""
        with self._operations:
            with self._lock:
                held = self._held.get(address)
            found = self._get(address)
            if found is None and (held is None or held.instance_id != instance_id):
                raise RegistrationLost(address, instance_id)
            if found is not None and found[0].instance_id != instance_id:
                self._forget(address, instance_id)
                raise RegistrationLost(address, instance_id)
            base = replacement or (found[0] if found is not None else held)
            assert base is not None
            try:
                taken = self._take(base)
            except NodeAddressTaken:
                self._forget(address, instance_id)
                raise RegistrationLost(address, instance_id) from None
            with self._lock:
                self._held[address] = taken

    def _forget(self, address: str, instance_id: str) -> None:
        with self._lock:
            held = self._held.get(address)
            if held is not None and held.instance_id == instance_id:
                del self._held[address]

    def unregister(self, address: str, instance_id: str) -> None:
        with self._operations:
            self._forget(address, instance_id)
            for _ in range(CONTENDED_ATTEMPTS):
                found = self._get(address)
                if found is None or found[0].instance_id != instance_id:
                    return  # not this instance's: nothing to remove
                try:
                    self._wait(self._client.delete_async(self._paths.node(address), found[1]))
                except NoNodeError:
                    return
                except BadVersionError:
                    continue  # renewed meanwhile: read again
                return

    def list_all(self) -> list[NodeRegistration]:
        names = self._wait(self._client.get_children_async(self._paths.nodes))
        assert isinstance(names, list)
        pending = [self._client.get_async(f"{self._paths.nodes}/{name}") for name in sorted(names)]
        nodes: list[NodeRegistration] = []
        for result in pending:
            try:
                data, _ = self._wait(result)
            except NoNodeError:
                continue  # its session ended since the listing
            nodes.append(NodeRegistration.decode(data))
        marked = self._draining()
        return sorted(
            (replace(node, draining=node.address in marked) for node in nodes),
            key=lambda node: node.address,
        )

    def _draining(self) -> set[str]:
        """The addresses with a draining mark (documents of NODE_DRAINING_SPACE)."""
        try:
            names = self._wait(
                self._client.get_children_async(self._paths.document_space(NODE_DRAINING_SPACE))
            )
        except NoNodeError:
            return set()
        return {key_of_znode(name) for name in names}

    # --- connection-state hooks, called on kazoo's connection thread

    def session_lost(self) -> None:
        with self._lock:
            self._session_lost = True

    def connected(self, spawn: Spawn) -> None:
        with self._lock:
            if not self._session_lost:
                return  # the same session: its ephemeral znodes are still there
            self._session_lost = False
            held = list(self._held.values())
        if held:
            spawn(self._recreate, held)

    def _recreate(self, held: list[NodeRegistration]) -> None:
        for registration in held:
            with self._lock:
                if self._held.get(registration.address) is not registration:
                    continue  # unregistered or renewed meanwhile
            try:
                self.register(registration)
            except NodeAddressTaken as taken:
                self._forget(registration.address, registration.instance_id)
                log.warning("registration not re-created after session expiry: %s", taken)
            except (MetadataError, KazooException, KazooTimeoutError) as error:
                log.warning(
                    "registration of %s not re-created after session expiry (%r); "
                    "the next renew_node tries again",
                    registration.address,
                    error,
                )
        log.info("re-created %d registration(s) after session expiry", len(held))
