"""What the streams layer uses of the client: `LedgerClient`.

A `Client` (pora/client/replication/client.py) offers streams (`create_stream`,
`open_stream`, ...) and so imports this layer; the streams are built on its
ledgers and its metadata store. Naming that much here lets the streams take the
client they are given without importing the module that imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pora.client.replication.reader import LedgerReader
from pora.client.replication.writer import LedgerWriter
from pora.meta.store import MetadataStore


class LedgerClient(Protocol):
    """The ledgers and the metadata store a stream is kept in (a `Client`)."""

    @property
    def store(self) -> MetadataStore: ...

    async def create_ledger(
        self,
        ensemble_size: int = 3,
        write_quorum: int | None = None,
        ack_quorum: int | None = None,
        password: str | bytes = "",
        custom_metadata: Mapping[str, bytes] | None = None,
    ) -> LedgerWriter: ...

    async def open_ledger(
        self, ledger_id: int, password: str | bytes = "", *, recover: bool = True
    ) -> LedgerReader: ...

    async def delete_ledger(self, ledger_id: int, password: str | bytes = "") -> None: ...
