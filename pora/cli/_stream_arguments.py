"""The arguments of `pora stream`: a stream's name, the positions of --from and
--to (a bad one ends the command with exit status 2 and what is wrong), and the
options of `create`.
"""

from __future__ import annotations

from typing import Final

from ledger.errors import InvalidArgument
from pora.cli._common import EXIT_REFUSED, CommandError
from pora.streams.document import check_stream_name
from pora.streams.position import Position
from pora.streams.reader import Start

#: the options of `create`, as create_stream names them
CONFIG_OPTIONS: Final = (
    ("ensemble_size", int, "E: nodes each segment's ledger is spread over (default 3)"),
    ("write_quorum", int, "Qw: copies of each entry (default 3)"),
    ("ack_quorum", int, "Qa: copies acknowledged before an append returns (default 2)"),
    ("segment_bytes_max", int, "roll to a new segment past this many bytes (default 256 MiB)"),
    ("segment_age_s_max", float, "roll to a new segment past this age (default 3600)"),
    ("retention_s", float, "keep entries this many seconds (default: forever)"),
    ("retention_bytes", int, "keep at most this many bytes (default: no limit)"),
    (
        "retention_s_max",
        float,
        "remove entries older than this even if a cursor needs them (default: never)",
    ),
    (
        "retention_bytes_max",
        int,
        "keep at most this many bytes even if a cursor needs more (default: no limit)",
    ),
    ("commit_keys_max", int, "commit keys kept for idempotent commits (default 10000)"),
    ("txn_idle_s_max", float, "a transaction idle this long is abandoned (default 86400)"),
    ("txn_pending_max", int, "pending transactions held at once (default 500)"),
    ("txn_segments_max", int, "segments of pending transactions, together (default 3000)"),
    ("app_ids_max", int, "app ids recorded for versioned commits (default 1000)"),
)


def stream_name(name: str) -> str:
    try:
        return check_stream_name(name)
    except InvalidArgument as error:
        raise CommandError(str(error), EXIT_REFUSED) from None


def _position(option: str, text: str) -> Position:
    try:
        return Position.parse(text)
    except InvalidArgument as error:
        raise CommandError(f"{option} {text}: {error}", EXIT_REFUSED) from None


def parse_start(text: str) -> Start:
    """--from: "beginning" (None), "end", or a position."""
    if text == "beginning":
        return None
    if text == "end":
        return "end"
    return _position("--from", text)


def parse_stop(text: str) -> Position | None:
    """--to: "end" (None: the end as of the start) or a position."""
    return None if text == "end" else _position("--to", text)
