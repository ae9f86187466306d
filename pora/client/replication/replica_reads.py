"""R24: reading one entry from its write set: the members in order, the next one on an
error, a timeout, a damaged copy or another instance, a speculative read to the next
one after `speculative_read_delay_s` without an answer; the first valid copy wins.

Shared by the reader and by a recovery (which reads the entry before its first one to
learn the ledger's length)."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio

from journal.errors import PoraError
from ledger.errors import NoSuchEntry, NoSuchLedger
from pora.client.node_channel import NodeChannel
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import ReplicatedEntry, decode_entry
from pora.client.replication.errors import EntryDamaged, EntryUnreadable
from pora.meta.records import EnsembleMember

ChannelFor = Callable[[str], Awaitable[NodeChannel]]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaAnswer:
    """A valid copy of an entry and the LAC its node piggybacked."""

    entry: ReplicatedEntry
    last_add_confirmed: int
    address: str


class AllAnsweredNoSuchEntry(PoraError):
    """Every member of the write set said it does not hold the entry (the caller
    decides: above the LAC that is "not written yet", at or below it a loss)."""

    def __init__(self, ledger_id: int, entry_id: int, members: list[str]) -> None:
        self.ledger_id = ledger_id
        self.entry_id = entry_id
        self.members = members
        super().__init__(f"no member of entry {entry_id}'s write set holds it: {members}")


#: what a failed replica read leaves: why, and whether it was "no such entry"
_Failure = tuple[str, bool]


async def read_from_write_set(
    channel_for: ChannelFor,
    config: ClientConfig,
    ledger_id: int,
    entry_id: int,
    write_set: Sequence[EnsembleMember],
    on_damaged: Callable[[str, EntryDamaged], None] | None = None,
    *,
    token: int = 0,
    on_speculative: Callable[[], None] | None = None,
) -> ReplicaAnswer:
    """R24, the copies checked against the record's `token` (an entry of another
    incarnation of the ledger id is a damaged copy). Raises AllAnsweredNoSuchEntry
    when every member said "no such entry", and EntryUnreadable (naming each member's
    answer) when none gave a valid copy."""
    members = tuple(write_set)
    send, receive = anyio.create_memory_object_stream[tuple[int, ReplicaAnswer | _Failure]](
        len(members)
    )
    failures: dict[str, _Failure] = {}

    async def ask(index: int) -> None:
        member = members[index]
        outcome = await _read_one(
            channel_for, config, ledger_id, entry_id, member, on_damaged, token
        )
        await send.send((index, outcome))

    async with send, receive, anyio.create_task_group() as group:
        launched = 0
        outstanding = 0
        while True:
            if launched < len(members) and outstanding == 0:
                group.start_soon(ask, launched)
                launched, outstanding = launched + 1, outstanding + 1
            if outstanding == 0:
                break
            more_to_ask = launched < len(members)
            delay = config.speculative_read_delay_s if more_to_ask else math.inf
            with anyio.move_on_after(delay):
                index, outcome = await receive.receive()
                outstanding -= 1
                if isinstance(outcome, ReplicaAnswer):
                    group.cancel_scope.cancel()
                    return outcome
                failures[members[index].address] = outcome
                continue
            # no answer within the delay: a speculative read to the next member too
            if on_speculative is not None:
                on_speculative()
            group.start_soon(ask, launched)
            launched, outstanding = launched + 1, outstanding + 1
    if all(absent for _, absent in failures.values()):
        raise AllAnsweredNoSuchEntry(ledger_id, entry_id, [m.address for m in members])
    raise EntryUnreadable(ledger_id, entry_id, {a: why for a, (why, _) in failures.items()})


async def _read_one(
    channel_for: ChannelFor,
    config: ClientConfig,
    ledger_id: int,
    entry_id: int,
    member: EnsembleMember,
    on_damaged: Callable[[str, EntryDamaged], None] | None,
    token: int,
) -> ReplicaAnswer | _Failure:
    try:
        with anyio.fail_after(config.node_timeout_s):
            channel = await channel_for(member.address)
            data, lac = await channel.read_entry(
                ledger_id, entry_id, instance_id=member.instance_id, timeout_s=config.node_timeout_s
            )
    except (NoSuchEntry, NoSuchLedger):
        return ("no such entry", True)
    except TimeoutError:
        return (f"no answer within {config.node_timeout_s} s", False)
    except PoraError as error:
        return (f"{type(error).__name__}: {error}", False)
    try:
        entry = decode_entry(ledger_id, entry_id, data, token=token)
    except EntryDamaged as damage:
        log.warning("replica %s: %s", member.address, damage)
        if on_damaged is not None:
            on_damaged(member.address, damage)
        return (f"damaged copy: {damage.what}", False)
    return ReplicaAnswer(entry, lac, member.address)
