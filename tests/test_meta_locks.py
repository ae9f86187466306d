"""The metadata store's locks (docs/rereplication.md, A4), on both backends: one
holder at a time, renewals, release, and a lock freed when its holder's lease runs out
(SQLite) or its session ends (ZooKeeper)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from zookeeper_support import fresh_zk_url

from pora.meta import InvalidMetadata, LockLost, open_metadata


@pytest.fixture(params=["sqlite", "zk"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "zk":
        return fresh_zk_url(request)
    return f"sqlite:///{tmp_path}/meta.db"


async def test_one_holder_at_a_time_until_it_releases(store_url: str) -> None:
    async with open_metadata(store_url) as a, open_metadata(store_url) as b:
        assert await a.acquire_lock("rereplicate-ledger-7", "worker-a", 30.0)
        assert await a.acquire_lock("rereplicate-ledger-7", "worker-a", 30.0)  # its own
        assert not await b.acquire_lock("rereplicate-ledger-7", "worker-b", 30.0)
        assert await b.acquire_lock("rereplicate-ledger-8", "worker-b", 30.0)  # another
        await a.renew_lock("rereplicate-ledger-7", "worker-a", 30.0)
        with pytest.raises(LockLost, match="worker-b"):
            await b.renew_lock("rereplicate-ledger-7", "worker-b", 30.0)
        await b.release_lock("rereplicate-ledger-7", "worker-b")  # not its: nothing
        assert not await b.acquire_lock("rereplicate-ledger-7", "worker-b", 30.0)
        await a.release_lock("rereplicate-ledger-7", "worker-a")
        assert await b.acquire_lock("rereplicate-ledger-7", "worker-b", 30.0)
        with pytest.raises(LockLost):
            await a.renew_lock("rereplicate-ledger-7", "worker-a", 30.0)


async def test_a_dead_holders_lock_is_free_again(store_url: str) -> None:
    async with open_metadata(store_url) as b:
        async with open_metadata(store_url) as a:
            assert await a.acquire_lock("rereplicate-ledger-1", "worker-a", 0.3)
            assert not await b.acquire_lock("rereplicate-ledger-1", "worker-b", 0.3)
        # leaving the block ends a's ZooKeeper session; SQLite's lease runs out
        with trio.fail_after(10):
            while not await b.acquire_lock("rereplicate-ledger-1", "worker-b", 30.0):  # noqa: ASYNC110
                await trio.sleep(0.05)  # nothing to wait on: the lock is another process's


async def test_a_lapsed_sqlite_lease_is_lost_even_if_nobody_took_it(tmp_path: Path) -> None:
    async with open_metadata(f"sqlite:///{tmp_path}/meta.db") as store:
        assert await store.acquire_lock("l", "worker-a", 0.05)
        await trio.sleep(0.1)
        with pytest.raises(LockLost):
            await store.renew_lock("l", "worker-a", 30.0)


@pytest.mark.parametrize(
    ("name", "holder", "lease_s"),
    [("", "w", 1.0), ("l", "", 1.0), ("l", "w", 0.0), ("l", "w", float("nan")), ("a\0", "w", 1.0)],
)
async def test_bad_lock_arguments_are_refused(
    store_url: str, name: str, holder: str, lease_s: float
) -> None:
    async with open_metadata(store_url) as store:
        with pytest.raises(InvalidMetadata):
            await store.acquire_lock(name, holder, lease_s)
