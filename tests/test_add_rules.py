"""The rules an add is taken by, stated once (`add_is_plain`, and the node's typed
checks): the served node's inlined copy in `entry_runs` gives the same answers, and
every way of adding refuses a broken add with the same typed error."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import pora
from journal.format import MASTER_KEY_BYTES_MAX
from journal.request import ID_MAX, Add, Request, add_is_plain, entry_runs

ENTRY_BYTES_MAX = 100


def test_entry_runs_refers_exactly_the_adds_that_are_not_plain_to_the_typed_checks() -> None:
    ids = [-1, 0, ID_MAX, ID_MAX + 1]
    lacs = [-2, -1, ID_MAX, ID_MAX + 1]
    keys = [b"", b"k" * MASTER_KEY_BYTES_MAX, b"k" * (MASTER_KEY_BYTES_MAX + 1)]
    payloads: list[bytes] = [b"", b"x" * ENTRY_BYTES_MAX, b"x" * (ENTRY_BYTES_MAX + 1)]
    payloads.append(bytearray(b"x"))  # type: ignore[arg-type]  # (a bytes-like payload)
    for ledger_id, entry_id, lac, key, payload in itertools.product(ids, ids, lacs, keys, payloads):
        add: Add = (7, ledger_id, entry_id, lac, key, payload, False)
        referred: list[Add] = []

        def refusal(add: Add, referred: list[Add] = referred) -> pora.PoraError:
            referred.append(add)
            return pora.InvalidArgument("refused")  # (taken, it would not encode)

        def on_done(_request: Request) -> None:
            pass

        entry_runs([add], ENTRY_BYTES_MAX, on_done, refusal)
        plain = add_is_plain(ledger_id, entry_id, lac, key, payload, ENTRY_BYTES_MAX)
        assert (referred == []) == plain, add[:4]


@pytest.mark.parametrize(
    ("ledger_id", "entry_id", "payload", "lac", "key", "error", "match"),
    [
        (-1, 0, b"a", -1, b"", pora.InvalidArgument, "ledger_id must be an integer"),
        (1, ID_MAX + 1, b"a", -1, b"", pora.InvalidArgument, "entry_id must be an integer"),
        (1, 0, b"x" * 2000, -1, b"", pora.EntryTooLarge, "entry_bytes_max"),
        (1, 0, b"a", -2, b"", pora.InvalidArgument, "last_add_confirmed must be >= -1"),
        (1, 0, b"a", -1, b"k" * 300, pora.InvalidArgument, "a master key has at most"),
    ],
)
async def test_every_way_of_adding_refuses_a_broken_add_alike(
    data_dir: Path,
    ledger_id: int,
    entry_id: int,
    payload: bytes,
    lac: int,
    key: bytes,
    error: type[pora.PoraError],
    match: str,
) -> None:
    async with pora.open_node(data_dir, entry_bytes_max=1024) as node:
        with pytest.raises(error, match=match):
            await node.add_entry(
                ledger_id, entry_id, payload, master_key=key, last_add_confirmed=lac
            )
        with pytest.raises(error, match=match):
            node.entry_request(ledger_id, entry_id, payload, master_key=key, last_add_confirmed=lac)
        with pytest.raises(error, match=match):
            node.run_request(ledger_id, entry_id, [payload], master_key=key, last_add_confirmed=lac)
        served = node.entry_requests([(1, ledger_id, entry_id, lac, key, payload, False)], print)
        assert served[0] == []
        assert len(served[1]) == 1 and isinstance(served[1][0][1], error)
        assert [s.ledger_id for s in node.ledgers()] == []  # nothing was stored


async def test_a_bytes_like_payload_is_taken_as_a_copy(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        payload = bytearray(b"before")
        await node.add_entry(1, 0, payload)  # type: ignore[arg-type]
        payload[:] = b"after!"
        assert await node.read_entry(1, 0) == b"before"
