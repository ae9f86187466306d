"""What the commands that read the cluster's metadata store share: the `--metadata URL`
option, running a query against the store and running a client (`pora.connect`) on
the cluster, their errors turned into exit statuses."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

import pora
from ledger.errors import InvalidArgument, InvalidArgumentType
from pora.cli._common import EXIT_PROBLEMS, EXIT_REFUSED, CommandError
from pora.client.replication.client import Client
from pora.meta import MetadataError, MetadataStore, MetadataUnavailable, open_metadata

T = TypeVar("T")


def add_metadata_argument(parser: argparse.ArgumentParser, *, required: bool) -> None:
    parser.add_argument(
        "--metadata",
        metavar="URL",
        required=required,
        help="the cluster's metadata store: sqlite:///abs/path.db, sqlite:relative/path.db "
        "or zk://host:port,.../chroot",
    )


def query_metadata(url: str, query: Callable[[MetadataStore], Awaitable[T]]) -> T:
    """Open the store at `url` (never creating it: an inspection of a wrong URL must
    not leave an empty store there), run `query` on it, close it. An unreachable or
    missing store ends the command with exit status 2 and the store's message."""

    async def main() -> T:
        async with open_metadata(url, create=False) as store:
            return await query(store)

    return run_on_metadata(url, main)


def run_on_metadata(url: str, main: Callable[[], Awaitable[T]]) -> T:
    """Run `main` under trio for a command on the store at `url`: an unreachable or
    missing store ends the command with exit status 2, another store error with 1."""
    # kazoo logs each failed connection attempt; the command's own error says it once
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)

    try:
        return trio.run(main)
    except MetadataUnavailable as error:
        raise CommandError(str(error), EXIT_REFUSED) from error
    except MetadataError as error:
        raise CommandError(f"metadata store {url}: {error}", EXIT_PROBLEMS) from error


def run_client(
    url: str,
    body: Callable[[Client], Awaitable[T]],
    refusals: tuple[type[BaseException], ...] = (),
) -> T:
    """Connect to the cluster at `url` and run `body`. A bad argument, an unreachable
    store, or one of the command's `refusals` (a missing ledger or stream, say) ends
    the command with exit status 2 and what the error says."""

    async def main() -> T:
        async with pora.connect(url) as client:
            return await body(client)

    refused: tuple[type[BaseException], ...] = (
        MetadataUnavailable,
        InvalidArgument,
        InvalidArgumentType,
        *refusals,
    )
    try:
        return trio.run(main)
    except refused as error:
        raise CommandError(str(error), EXIT_REFUSED) from error
