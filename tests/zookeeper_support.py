"""One local ZooKeeper server for the whole test run (started on first use, ~1 s,
stopped at exit); each test takes a chroot of its own so tests never see each other's
znodes."""

from __future__ import annotations

import atexit
import itertools
import tempfile
from pathlib import Path

import pytest

from pora.meta.local_zookeeper import LocalZooKeeper

_shared: list[LocalZooKeeper] = []
_chroots = itertools.count()


def shared_zookeeper() -> LocalZooKeeper:
    if not _shared:
        directory = Path(tempfile.mkdtemp(prefix="pora-test-zookeeper-"))
        # the run's data is thrown away: no fsync keeps the fast suite fast
        server = LocalZooKeeper(directory, force_sync=False)
        server.start()
        atexit.register(server.stop)
        _shared.append(server)
    return _shared[0]


def fresh_zk_url(request: pytest.FixtureRequest) -> str:
    """A URL on the shared server with a chroot no other test uses."""
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    return shared_zookeeper().url(f"/t{next(_chroots)}_{name}")
