"""What the replicating client's public calls raise for bad input and after the client
ended, as an application catches it: a typed error (`InvalidArgument`, a ValueError;
`InvalidArgumentType`, a TypeError; `NoSuchLedger`; `ClientClosed`;
`MetadataUnavailable`) that comes out of `async with pora.connect(...)` as itself,
under asyncio and trio, never an ExceptionGroup, an OverflowError or an
AttributeError from the layers below."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from event_loops import EVENT_LOOPS, Runner
from replication_support import local_cluster
from writer_support import client_on
from zookeeper_support import fresh_zk_url

import pora
from pora.meta.backends import open_metadata
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata


async def set_up(url: str) -> str:
    """A new, empty store at `url`, as the nodes set one up (a client never does)."""
    async with open_metadata(url, create=True):
        pass
    return url


RUNNERS = EVENT_LOOPS


# --- quorums: ints, checked at the call, the record and the writer agree -------------------


@pytest.mark.parametrize(
    "quorums",
    [(3, 2.5, 2), (3, 3, 2.5), (True, True, True), (3.0, 3, 2), (3, "2", 2)],
    ids=["Qw-float", "Qa-float", "bools", "E-float", "Qw-str"],
)
async def test_a_quorum_that_is_not_an_int_is_refused_and_nothing_is_created(
    tmp_path: Path, quorums: tuple[Any, Any, Any]
) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        with pytest.raises(pora.InvalidArgumentType, match="must be an int") as refused:
            await client.create_ledger(*quorums)
        assert isinstance(refused.value, TypeError)
        assert [ledger async for ledger in client.list_ledgers()] == []


async def test_quorums_out_of_order_are_an_invalid_argument_and_a_value_error(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        for quorums in [(3, 4, 2), (3, 2, 3), (3, 3, 0)]:
            with pytest.raises(pora.InvalidArgument, match="E >= Qw >= Qa >= 1") as refused:
                await client.create_ledger(*quorums)
            assert isinstance(refused.value, ValueError)
        # what was accepted is exactly what the record holds, and the writer's
        writer = await client.create_ledger(3, 2, 2)
        record = (await cluster.store.read_ledger(writer.ledger_id)).value
        assert (record.ensemble_size, record.write_quorum, record.ack_quorum) == (3, 2, 2)
        assert writer.metadata == record
        await writer.close()


@pytest.mark.parametrize(
    "field",
    [{"write_quorum": 2.5}, {"ack_quorum": True}, {"ensemble_size": 3.0}, {"ledger_id": 1.5}],
    ids=["Qw-float", "Qa-bool", "E-float", "id-float"],
)
def test_a_ledger_record_with_a_quorum_that_is_not_an_int_is_invalid(
    field: dict[str, Any],
) -> None:
    members = tuple(EnsembleMember(f"127.0.0.1:{4000 + k}", f"i{k}") for k in range(3))
    fields: dict[str, Any] = {
        "ledger_id": 1,
        "ensemble_size": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "ensembles": (Ensemble(0, members),),
        "password_digest": b"",
        "created_ms": 0,
        **field,
    }
    with pytest.raises(pora.InvalidMetadata, match="must be an int"):
        LedgerMetadata(**fields).validate()


# --- errors leave `async with pora.connect(...)` as themselves ------------------------------


@RUNNERS
def test_a_typed_error_leaves_the_connect_block_as_itself(tmp_path: Path, runner: Runner) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"

    async def main() -> None:
        await set_up(url)
        try:
            async with pora.connect(url) as client:
                await client.open_ledger(7)
        except pora.NoSuchLedger as error:
            assert error.ledger_id == 7
        else:
            raise AssertionError("open_ledger(7) on an empty store did not raise")

    runner(main)


@RUNNERS
def test_errors_raised_together_in_the_block_stay_in_their_group(
    tmp_path: Path, runner: Runner
) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"

    async def main() -> None:
        await set_up(url)
        async with pora.connect(url):
            # the application's own group of two: it is the group that leaves the block
            raise ExceptionGroup("two at once", [pora.NoSuchLedger(1), KeyError(2)])

    with pytest.raises(ExceptionGroup, match="two at once") as group:
        runner(main)
    assert [type(error) for error in group.value.exceptions] == [pora.NoSuchLedger, KeyError]


@RUNNERS
def test_a_block_that_awaits_nothing_leaves_at_once(tmp_path: Path, runner: Runner) -> None:
    # the client's node calls had not started when the block ended: they must still stop
    url = f"sqlite:///{tmp_path}/meta.db"

    async def main() -> None:
        await set_up(url)
        with anyio.fail_after(30):
            async with pora.connect(url):
                pass

    runner(main)


# --- after the client ended -----------------------------------------------------------------


async def test_a_closed_clients_readers_writers_and_calls_raise_client_closed(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        async with client_on(cluster) as client:
            writer = await client.create_ledger(3, 3, 2)
            await writer.append_many([b"a", b"b", b"c"])
            follower = await client.open_ledger(writer.ledger_id, recover=False)
            await writer.close()
            reader = await client.open_ledger(writer.ledger_id)
            assert await reader.read(1) == b"b"
            still_open = await client.create_ledger(3, 3, 2)
        with pytest.raises(pora.ClientClosed, match="closed"):
            await reader.read(1)
        with pytest.raises(pora.ClientClosed):
            [entry async for entry in reader.read_entries(0, 2)]
        with pytest.raises(pora.ClientClosed):
            [entry async for entry in follower.tail()]
        with pytest.raises(pora.ClientClosed):
            await still_open.append(b"d")
        with pytest.raises(pora.ClientClosed):
            await client.open_ledger(writer.ledger_id)
        with pytest.raises(pora.ClientClosed):
            await client.create_ledger(3, 3, 2)
        with pytest.raises(pora.ClientClosed):
            await client.delete_ledger(writer.ledger_id)


# --- ledger ids, passwords and URLs ----------------------------------------------------------


@pytest.fixture(params=["sqlite", "zk"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "zk":
        return fresh_zk_url(request)
    return f"sqlite:///{tmp_path}/meta.db"


@pytest.mark.parametrize("ledger_id", [2**63, -1, 2**64 + 5])
async def test_an_id_no_ledger_can_have_is_no_such_ledger_on_both_backends(
    store_url: str, ledger_id: int
) -> None:
    async with pora.connect(await set_up(store_url)) as client:
        with pytest.raises(pora.NoSuchLedger, match=r"\[0, 2\*\*63\)"):
            await client.open_ledger(ledger_id)
        with pytest.raises(pora.NoSuchLedger):
            await client.delete_ledger(ledger_id)


@pytest.mark.parametrize("ledger_id", ["7", 7.0, True, None])
async def test_a_ledger_id_that_is_not_an_int_is_a_type_error(
    tmp_path: Path, ledger_id: Any
) -> None:
    async with pora.connect(await set_up(f"sqlite:///{tmp_path}/meta.db")) as client:
        with pytest.raises(pora.InvalidArgumentType, match="ledger_id must be an int"):
            await client.open_ledger(ledger_id)


async def test_a_password_of_none_is_refused_naming_the_argument(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        with pytest.raises(pora.InvalidArgumentType, match="password must be a str or bytes"):
            await client.create_ledger(3, password=None)  # type: ignore[arg-type]
        assert [ledger async for ledger in client.list_ledgers()] == []
        writer = await client.create_ledger(3)
        with pytest.raises(TypeError, match="password must be a str or bytes"):
            await client.open_ledger(writer.ledger_id, password=None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="password must be a str or bytes"):
            await client.delete_ledger(writer.ledger_id, password=None)  # type: ignore[arg-type]
        await writer.close()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("zk://127.0.0.1:notaport/x", "the port 'notaport' is not a number"),
        ("zk://[::1/x", "IPv6 address needs its closing bracket"),
        ("zk://::1:2181/x", "IPv6 address goes in brackets"),
        ("zk://127.0.0.1:2181,:2182/x", "no host"),
        ("mysql://x", "unknown URL scheme"),
    ],
)
async def test_a_malformed_metadata_url_is_metadata_unavailable_saying_what_to_write(
    url: str, says: str
) -> None:
    with pytest.raises(pora.MetadataUnavailable, match="zk://host:port") as refused:
        async with pora.connect(url):
            pass
    assert says in str(refused.value)


async def test_a_url_that_is_not_a_str_is_a_type_error() -> None:
    with pytest.raises(pora.InvalidArgumentType, match="url must be a str"):
        async with pora.connect(42):  # type: ignore[arg-type]
            pass
