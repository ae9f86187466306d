"""`pora stream list` and `pora stream show`: what the metadata store holds of the
cluster's streams, read only (no client is connected), as tables or --json.
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from pora.cli._common import (
    EXIT_OK,
    EXIT_REFUSED,
    CommandError,
    command,
    print_fields,
    print_json,
    print_table,
)
from pora.cli._metadata import query_metadata
from pora.cli._stream_arguments import CONFIG_OPTIONS, stream_name
from pora.meta import MetadataStore
from pora.meta.errors import NoSuchDocument
from pora.streams.cursors import CursorState, cursor_states
from pora.streams.document import (
    STREAMS_SPACE,
    Segment,
    SegmentState,
    StreamConfig,
    StreamDocument,
    decode_document,
)
from pora.streams.errors import NoSuchStream
from pora.streams.records import StreamRecord
from pora.streams.stream import StreamInfo

T = TypeVar("T")

#: the document's sections this command knows; any other one (a later version's
#: transactions, cursors, commit keys) is printed as the document holds it
_KNOWN_SECTIONS: Final = frozenset(
    {
        "format_version",
        "name",
        "config",
        "state",
        "commit",
        "segments",
        "pages",
        "next_seq",
        "writer",
        "created_ms",
    }
)
#: stream names read per page by `list`
_LIST_PAGE: Final = 1000
_LIST_COLUMNS: Final = ("name", "state", "commit", "segments", "writer_epoch")
_SEGMENT_COLUMNS: Final = ("seq", "ledger_id", "state", "entries", "bytes", "commit")


def _query(url: str, query: Callable[[MetadataStore], Awaitable[T]]) -> T:
    try:
        return query_metadata(url, query)
    except NoSuchStream as error:
        raise CommandError(str(error), EXIT_REFUSED) from error


# -- what is printed ------------------------------------------------------------------------


def _segment_count(info: StreamInfo | StreamDocument) -> int:
    paged = sum(ref.last_seq - ref.first_seq + 1 for ref in info.pages)
    return paged + len(info.segments)


def segment_row(segment: Segment) -> dict[str, Any]:
    """A segment as `show` prints it; an OPEN segment's entries and bytes are the live
    writer's (None); a LOST one (its ledger deleted outside the stream) holds none."""
    closed = segment.state is SegmentState.CLOSED
    return {
        "seq": segment.seq,
        "ledger_id": segment.ledger_id,
        "state": "LOST" if segment.lost else segment.state.value,
        "entries": segment.last_entry_id + 1 if closed else None,
        "bytes": segment.byte_length if closed else None,
        "commit": segment.commit,
        "created_ms": segment.created_ms,
    }


def config_dict(config: StreamConfig) -> dict[str, Any]:
    return {option: getattr(config, option) for option, _kind, _text in CONFIG_OPTIONS}


def shown_state(doc: StreamDocument) -> str:
    """ACTIVE or SEALED; DELETING for a stream whose delete did not finish (it is gone
    for every client: `pora stream delete` again finishes it)."""
    return "DELETING" if doc.deleting else doc.state.value


def stream_details(
    doc: StreamDocument,
    segments: list[Segment],
    raw: Mapping[str, Any],
    cursors: Sequence[CursorState] = (),
) -> dict[str, Any]:
    """What `show --json` prints: the document's known sections, decoded, its cursors,
    then every other section as the document holds it."""
    details: dict[str, Any] = {
        "name": doc.name,
        "state": shown_state(doc),
        "commit": doc.commit,
        "writer_epoch": doc.writer_epoch,
        "writer_segment": doc.writer_segment,
        "next_seq": doc.next_seq,
        "created_ms": doc.created_ms,
        "config": config_dict(doc.config),
        "segments": [segment_row(s) for s in segments],
        "transactions": [
            {
                "id": txn.id,
                "created_ms": txn.created_ms,
                "active_ms": txn.active_ms,
                "segments": [
                    {"ledger_id": s.ledger_id, "created_ms": s.created_ms} for s in txn.segments
                ],
            }
            for txn in doc.transactions
        ],
        "commit_keys": [{"digest": k.digest, "commit": k.commit} for k in doc.commit_keys],
        "app_versions": [
            {"app_id": a.app_id, "version": a.version, "commit": a.commit} for a in doc.app_versions
        ],
        "cursors": [
            {"name": c.name, "next_position": str(c.next_position), "created_ms": c.created_ms}
            for c in cursors
        ],
        "attributes": dict(doc.attributes),
    }
    for section, value in raw.items():
        if section not in _KNOWN_SECTIONS and section not in details:
            details[section] = value
    return details


#: the keys of `stream_details` that `_print_details` prints itself
_SHOWN: Final = frozenset(
    {
        "writer_epoch",
        "writer_segment",
        "config",
        "segments",
        "created_ms",
        "state",
        "name",
        "transactions",
        "commit_keys",
        "app_versions",
        "cursors",
        "attributes",
    }
)
#: the characters of an attribute's value `show` prints (--json prints it whole)
ATTRIBUTE_SHOWN_CHARS: Final = 80


def time_text(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds")


def _shortened(value: str) -> str:
    """The value's first characters on one line (line breaks and other control
    characters escaped as JSON does)."""
    shown = json.dumps(value[:ATTRIBUTE_SHOWN_CHARS], ensure_ascii=False)[1:-1]
    if len(value) <= ATTRIBUTE_SHOWN_CHARS:
        return shown
    return f"{shown}... ({len(value)} characters)"


def _print_details(details: dict[str, Any]) -> None:
    keys = details["commit_keys"]
    fields: list[tuple[str, object]] = [
        ("name", details["name"]),
        ("state", details["state"]),
        ("commit", details["commit"]),
        ("writer_epoch", details["writer_epoch"]),
        ("writer_segment", "-" if details["writer_segment"] is None else details["writer_segment"]),
        ("next_seq", details["next_seq"]),
        ("created", time_text(details["created_ms"])),
        (
            "commit_keys",
            f"{len(keys)} recorded" + (f" (newest: commit {keys[-1]['commit']})" if keys else ""),
        ),
    ]
    fields += [(f"config.{k}", "-" if v is None else v) for k, v in details["config"].items()]
    extra = [k for k in details if k not in _KNOWN_SECTIONS and k not in _SHOWN]
    fields += [(section, json.dumps(details[section])) for section in extra]
    print_fields(fields)
    print()
    rows = [
        ["-" if row[c] is None else row[c] for c in _SEGMENT_COLUMNS] for row in details["segments"]
    ]
    print_table(_SEGMENT_COLUMNS, rows)
    sections: list[tuple[str, tuple[str, ...], list[list[object]]]] = [
        (
            "pending transactions",
            ("id", "segments", "ledger_ids", "created", "active"),
            [
                [
                    txn["id"],
                    len(txn["segments"]),
                    ",".join(str(s["ledger_id"]) for s in txn["segments"]) or "-",
                    time_text(txn["created_ms"]),
                    time_text(txn["active_ms"]),
                ]
                for txn in details["transactions"]
            ],
        ),
        (
            "app versions",
            ("app_id", "version", "commit"),
            [[a["app_id"], a["version"], a["commit"]] for a in details["app_versions"]],
        ),
        (
            "cursors",
            ("name", "next_position"),
            [[c["name"], c["next_position"]] for c in details["cursors"]],
        ),
        (
            "attributes",
            ("key", "value"),
            [[key, _shortened(value)] for key, value in sorted(details["attributes"].items())],
        ),
    ]
    for title, columns, section_rows in sections:
        print()
        if not section_rows:
            print(f"{title}: none")
            continue
        print(f"{title}:")
        print_table(columns, section_rows)


# -- the commands ---------------------------------------------------------------------------


@command
def run_list(args: argparse.Namespace) -> int:
    async def query(store: MetadataStore) -> list[dict[str, Any]]:
        rows = []
        after = ""
        while True:
            names = await store.list_documents(STREAMS_SPACE, after=after, limit=_LIST_PAGE)
            for name in names:
                try:
                    record = await store.read_document(STREAMS_SPACE, name)
                except NoSuchDocument:
                    continue  # deleted meanwhile
                doc = decode_document(record.value)
                rows.append(
                    {
                        "name": doc.name,
                        "state": shown_state(doc),
                        "commit": doc.commit,
                        "segments": _segment_count(doc),
                        "writer_epoch": doc.writer_epoch,
                    }
                )
            if len(names) < _LIST_PAGE:
                return rows
            after = names[-1]

    rows = _query(args.metadata, query)
    if args.json:
        print_json({"streams": rows})
    else:
        print_table(_LIST_COLUMNS, [[row[c] for c in _LIST_COLUMNS] for row in rows])
    return EXIT_OK


@command
def run_show(args: argparse.Namespace) -> int:
    name = stream_name(args.name)

    async def query(store: MetadataStore) -> dict[str, Any]:
        try:
            record = await store.read_document(STREAMS_SPACE, name)
        except NoSuchDocument as gone:
            raise NoSuchStream(name) from gone
        doc = decode_document(record.value)
        segments = [s async for s in StreamRecord(store, name).segments_from(doc, doc.first_seq)]
        cursors = [state async for state in cursor_states(store, name)]
        return stream_details(doc, segments, json.loads(record.value), cursors)

    details = _query(args.metadata, query)
    if args.json:
        print_json(details)
    else:
        _print_details(details)
    return EXIT_OK
