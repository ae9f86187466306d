"""`pora verify [--rebuild-index]`: check a stopped node's storage, or rebuild its index.

Checks are in `pora.verify`; the rebuild is in `pora.rebuild`, followed by a journal
replay with the node's own recovery code (`pora.offline_recovery`).
"""

from __future__ import annotations

import argparse
from typing import Any

from journal.errors import PoraError
from ledger.entrylog_format import STATE_ENTRY_ID
from ledger.state import LedgerMeta
from pora.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CommandError,
    add_common_arguments,
    command,
    fail,
    offline_data_dir,
    open_index,
    pora_error_message,
    print_fields,
    print_json,
    print_table,
)
from pora.tools.offline_replay import recover, report_json
from pora.tools.progress import Progress
from pora.tools.rebuild import (
    Damage,
    RebuildReport,
    entry_log_bytes,
    rebuild_index,
    unrestored,
)
from pora.tools.verify import VerifyReport, verify_data_dir, verify_total_bytes

_PROBLEM_COLUMNS = ("kind", "ledger", "entry", "file", "offset", "problem")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check index, metadata and entry logs agree; or rebuild the index",
        description="Check a stopped node's storage: every index position points at an "
        "intact record (length, entry id, CRC) of the right entry; every entry-log record "
        "is indexed; each ledger's metadata agrees with what is stored; nothing in the "
        "journal awaits replay. Each problem is reported with ledger, entry, file and "
        "offset; exit status 1 if there is any. With --rebuild-index: move the index "
        "aside (it is kept, renamed index.damaged-<time>), build a new one from the entry "
        "logs, then replay the journal as recovery does.",
    )
    add_common_arguments(parser)
    parser.add_argument(
        "--rebuild-index",
        action="store_true",
        help="rebuild the index and ledger metadata from the entry logs and the journal",
    )
    parser.set_defaults(run=run)


@command
def run(args: argparse.Namespace) -> int:
    if args.rebuild_index:
        return _rebuild(args)
    with offline_data_dir(args.data_dir) as directory, open_index(directory) as index:
        try:
            metas: dict[int, LedgerMeta] = index.load_all_meta()
        except ValueError as error:
            raise CommandError(
                f"ledger metadata cannot be read ({error}); if the index is damaged, "
                "rebuild it with `pora verify --rebuild-index`"
            ) from error
        with Progress("verifying", verify_total_bytes(metas)) as bar:
            report = verify_data_dir(directory, index, metas, advance=bar.advance)
    if args.json:
        print_json(report.to_json())
    else:
        _print_verify(report)
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _print_verify(report: VerifyReport) -> None:
    print_fields(
        [
            ("ledgers", report.ledgers),
            ("entries", report.entries),
            ("entry-log bytes", report.entry_log_bytes),
            ("problems", len(report.problems)),
        ]
    )
    for note in report.notes:
        print(f"note: {note}")
    if report.problems:
        print()
        print_table(
            _PROBLEM_COLUMNS,
            [
                [
                    p.kind,
                    _dash(p.ledger_id),
                    _dash(p.entry_id),
                    _dash(p.file),
                    _dash(p.offset),
                    p.message,
                ]
                for p in report.problems
            ],
        )
        print("\nwhat to do: see docs/operations.md, 'pora verify found problems'")
    else:
        print("result: OK")


def _dash(value: object) -> object:
    return "-" if value is None else value


def _rebuild(args: argparse.Namespace) -> int:
    with (
        offline_data_dir(args.data_dir) as directory,
        Progress("rebuilding index", entry_log_bytes(directory)) as bar,
    ):
        rebuilt = rebuild_index(directory, advance=bar.advance)
    # the node takes the lock itself for the replay
    replay: dict[str, Any] | None = None
    replay_error: str | None = None
    try:
        replay = report_json(recover(directory))
    except (PoraError, BaseExceptionGroup) as error:
        replay_error = pora_error_message(error)
        if replay_error is None:
            raise
    lost = rebuilt.damage
    if replay is not None and rebuilt.damage:
        with offline_data_dir(args.data_dir) as directory, open_index(directory) as index:
            lost = unrestored(index, rebuilt.damage)
    damage = [{**d.to_json(), "restored": d not in lost} for d in rebuilt.damage]
    ok = rebuilt.ok and not lost and replay_error is None
    result: dict[str, Any] = {
        **rebuilt.to_json(),
        "ok": ok,
        "damage": damage,
        "replay": replay,
        "replay_error": replay_error,
    }
    if args.json:
        print_json(result)
    else:
        _print_rebuild(rebuilt, replay, lost, ok=ok)
    if replay_error is not None:
        return fail(
            f"the index was rebuilt, but replaying the journal failed: {replay_error}. "
            "See docs/operations.md, 'Journal corruption'; once the journal is repaired, "
            "run `pora recover`",
            EXIT_PROBLEMS,
        )
    return EXIT_OK if ok else EXIT_PROBLEMS


def _print_rebuild(
    report: RebuildReport, replay: dict[str, Any] | None, lost: list[Damage], *, ok: bool
) -> None:
    replayed = (
        "not done (see the error below)"
        if replay is None
        else f"{replay['records_replayed']} of {replay['records_scanned']} records, "
        f"{len(replay['ledgers_touched'])} ledgers, {replay['segments']} segments"
    )
    print_fields(
        [
            ("old index", report.moved_aside or "none (it was missing)"),
            ("ledgers rebuilt", report.ledgers),
            ("entries indexed", f"{report.entries} ({report.payload_bytes} payload bytes)"),
            ("state records", report.state_records),
            ("journal replayed", replayed),
        ]
    )
    for damage in report.damage:
        where = f"ledger {damage.ledger_id}: {damage.file} at byte {damage.offset}"
        if damage.resumes_at is not None:
            where += f" (unreadable up to byte {damage.resumes_at})"
        what = (
            "a state record"
            if damage.claimed_entry_id == STATE_ENTRY_ID
            else f"a record naming entry {damage.claimed_entry_id}"
        )
        if damage in lost:
            print(
                f"DAMAGED: {where}: {what} ({damage.reason}) that the journal did not restore: "
                "what it held (entries, or the ledger's closed/fenced state and key) may be "
                "lost on this node; compare the ledger with its replicas"
            )
        else:
            print(
                f"note: {where}: {what} ({damage.reason}), restored by the journal replay "
                "(the trace of a flush cut by a crash)"
            )
    for path in report.strays:
        print(f"note: {path} is not an entry log (by its name); ignored")
    for bad_state in report.unreadable_state:
        print(
            f"UNREADABLE STATE: ledger {bad_state['ledger_id']}: {bad_state['file']} at byte "
            f"{bad_state['offset']}: {bad_state['reason']}; check its state with "
            "`pora ledger show` (it may be closed or fenced on its other replicas)"
        )
    for unreadable in report.unreadable_logs:
        print(
            f"UNREADABLE: ledger {unreadable['ledger_id']}: {unreadable['file']}: "
            f"{unreadable['reason']}; the ledger was not rebuilt"
        )
    print("result: " + ("OK" if ok else "rebuilt with problems (see above)"))
