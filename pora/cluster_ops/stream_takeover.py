"""A11: a worker takes an abandoned stream over by the stream's own rules
(docs/streams.md, "The writer and takeover"), so that its OPEN segment becomes a
closed ledger the worker can repair.

The worker opens the stream's live writer and closes it at once: the writer's opening
bumps the epoch (the earlier writer is fenced), recovers the earlier OPEN segment and
closes it at its recovered end; its close leaves its own segment CLOSED and empty, so
the next writer takes over a stream with no OPEN segment. Nothing of the takeover is
written here: it is the streams package's, used through its public API."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pora.client.node_channel import NodeChannel
from pora.client.replication.client import client_on_store
from pora.client.replication.config import ClientConfig
from pora.client.replication.replica_reads import ChannelFor
from pora.meta.store import MetadataStore
from pora.streams.document_model import SegmentState
from pora.streams.errors import NoSuchStream, StreamSealed


async def take_over_stream(
    store: MetadataStore,
    channel_for: ChannelFor,
    config: ClientConfig,
    stream: str,
    ledger_id: int,
) -> bool:
    """Take `stream` over and close its writer at once, if its OPEN segment is still
    `ledger_id`'s; False (nothing done) when it is not (its writer rolled over or
    closed it, a seal closed it, or the stream is gone)."""

    @asynccontextmanager
    async def borrowed(address: str) -> AsyncIterator[NodeChannel]:
        # the worker's own connections: the client borrows them, never closes them
        yield await channel_for(address)

    async with client_on_store(store, borrowed, config, random.Random()) as client:
        try:
            handle = await client.open_stream(stream)
            segments = (await handle.info()).segments
            if not any(s.ledger_id == ledger_id and s.state is SegmentState.OPEN for s in segments):
                return False
            async with handle.open_writer():
                pass  # opening took the stream over; leaving closes the writer's segment
        except (NoSuchStream, StreamSealed):
            return False
    return True
