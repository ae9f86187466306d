"""Locks in ZooKeeper (docs/rereplication.md, A4): one ephemeral znode per held lock,
holding the holder's name, owned by the session of the store that took it. The lock
goes with the session: a holder that dies loses it a session timeout later, with no
renewal to write. Every method runs in a worker thread of the store."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from pora.meta.errors import LockLost

Wait = Callable[[Any], Any]  # kazoo has no type hints


class ZkLocks:
    def __init__(self, client: KazooClient, folder: str, path_of: Callable[[str], str], wait: Wait):
        self._client = client
        self._folder = folder
        self._path_of = path_of
        self._wait = wait

    def _session(self) -> int | None:
        client_id = self._client.client_id
        return None if client_id is None else int(client_id[0])

    def _ours(self, name: str, holder: str) -> int | None:
        """The lock znode's version if this session holds it for `holder`, else None."""
        try:
            data, stat = self._wait(self._client.get_async(self._path_of(name)))
        except NoNodeError:
            return None
        if data.decode() != holder or int(stat.ephemeralOwner) != self._session():
            return None
        return int(stat.version)

    def acquire(self, name: str, holder: str) -> bool:
        path = self._path_of(name)
        for _ in range(2):  # the folder made on first use, then the create again
            try:
                self._wait(self._client.create_async(path, holder.encode(), ephemeral=True))
            except NoNodeError:
                with contextlib.suppress(NodeExistsError):
                    self._wait(self._client.create_async(self._folder, b""))
            except NodeExistsError:
                return self._ours(name, holder) is not None
            else:
                return True
        return False

    def renew(self, name: str, holder: str) -> None:
        if self._ours(name, holder) is None:
            raise LockLost(name, holder)

    def release(self, name: str, holder: str) -> None:
        version = self._ours(name, holder)
        if version is None:
            return
        with contextlib.suppress(NoNodeError, BadVersionError):
            self._wait(self._client.delete_async(self._path_of(name), version))
