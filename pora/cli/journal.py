"""`pora journal dump` and `pora journal verify`: read a stopped node's journal.

Both read through `JournalScanner`, the reader recovery uses, so they see exactly
what recovery would: intact records in seq order, a torn tail (the normal end of a
crashed journal), or corruption (damage with valid data after it), which they report
with segment and offset.
"""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from journal.errors import JournalCorruption, JournalError, JournalFormatError, JournalGap
from journal.reader import JournalRecord, JournalScanner, ScanSummary
from pora.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    TableWriter,
    add_common_arguments,
    command,
    offline_data_dir,
    print_fields,
    print_json,
    print_json_line,
)
from pora.tools.inspection import journal_data_bytes, segment_starts, torn_tail_json
from pora.tools.progress import Progress

_DUMP_COLUMNS = ("segment", "offset", "seq", "type", "ledger", "entry", "size", "checksum")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "journal",
        help="inspect the journal (dump, verify)",
        description="Inspect a stopped node's journal.",
    )
    commands = parser.add_subparsers(dest="journal_command", metavar="COMMAND")
    parser.set_defaults(run=lambda _args: _usage(parser))

    dump = commands.add_parser(
        "dump",
        help="print the journal's records in order",
        description="Print the journal's records in seq order: segment, offset, seq, type, "
        "ledger, entry, payload size and checksum status. Every record printed passed its "
        "checksum; a torn tail is reported after the last one, corruption as an error "
        "(exit status 1) with segment and offset.",
    )
    add_common_arguments(dump)
    dump.add_argument("--ledger", type=int, metavar="ID", help="only this ledger's records")
    dump.add_argument("--from-seq", type=int, default=0, metavar="N", help="from this seq on")
    dump.add_argument("--to-seq", type=int, metavar="M", help="up to this seq (inclusive)")
    dump.set_defaults(run=run_dump)

    verify = commands.add_parser(
        "verify",
        help="check every journal record; report a torn tail or corruption",
        description="Check every record of the journal, and that its segments hold every "
        "seq from the journal watermark on. A torn tail (a last group commit that is not "
        "whole: cut by a crash, or damaged) is reported with the records it drops and why, "
        "and exits 0. Corruption (a damaged record with valid records after it), a gap (a "
        "missing segment) or an unknown format version is reported with segment and "
        "offset and exits 1.",
    )
    add_common_arguments(verify)
    verify.set_defaults(run=run_verify)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _record_json(record: JournalRecord) -> dict[str, Any]:
    return {
        "segment": record.segment.name,
        "offset": record.offset,
        "seq": record.seq,
        "type": record.kind.name.lower(),
        "ledger": record.ledger_id,
        "entry": record.entry_id,
        "size": len(record.payload),
        # the scanner returns only records whose crc matched
        "checksum": "ok",
    }


@command
def run_dump(args: argparse.Namespace) -> int:
    with offline_data_dir(args.data_dir) as directory:
        scanner = JournalScanner(
            directory.journal_dir,
            from_seq=max(args.from_seq, 0),
            require_watermark=directory.journal_watermark_required,
        )
        table = TableWriter(_DUMP_COLUMNS)
        error: JournalError | None = None
        finished = True
        try:
            for batch in scanner.batches():
                for record in batch:
                    if args.to_seq is not None and record.seq > args.to_seq:
                        finished = False
                        break
                    if args.ledger is not None and record.ledger_id != args.ledger:
                        continue
                    row = _record_json(record)
                    if args.json:
                        print_json_line(row)
                    else:
                        table.add([row[c] for c in _DUMP_COLUMNS])
                if not finished:
                    break
        except JournalError as caught:
            error = caught
        summary = scanner.summary
        torn = torn_tail_json(summary.torn_tail) if finished else None
        if args.json:
            print_json_line({"summary": {**_summary_json(summary), "torn_tail": torn}})
        else:
            table.flush()
            if torn is not None:
                print(f"-- torn tail: {torn['message']}")
        if error is not None:
            raise error
        return EXIT_OK


def _summary_json(summary: ScanSummary) -> dict[str, Any]:
    return {
        "segments": summary.segments,
        "batches": summary.batches,
        "records": summary.records,
        "record_bytes": summary.record_bytes,
        "first_seq": summary.first_seq,
        "last_seq": summary.last_seq,
    }


@command
def run_verify(args: argparse.Namespace) -> int:
    with offline_data_dir(args.data_dir) as directory:
        journal_dir = directory.journal_dir
        scanner = JournalScanner(
            journal_dir, require_watermark=directory.journal_watermark_required
        )
        records_by_segment: Counter[str] = Counter()
        problem: dict[str, Any] | None = None
        starts = segment_starts(journal_dir)
        with Progress("verifying journal", journal_data_bytes(journal_dir)) as bar:
            try:
                for batch in scanner.batches():
                    last = batch[-1]
                    # journal records, as the summary counts them: the entries of a
                    # run share their record's seq
                    records_by_segment[last.segment.name] += last.seq - batch[0].seq + 1
                    bar.update(starts.get(last.segment, 0) + last.offset)
            except JournalGap as error:
                problem = {
                    "kind": "gap",
                    "segment": str(error.path),
                    "offset": None,
                    "reason": error.reason,
                    "missing_seqs": [error.first_missing, error.last_missing],
                }
            except JournalCorruption as error:
                problem = {
                    "kind": "corruption",
                    "segment": str(error.path),
                    "offset": error.offset,
                    "reason": error.reason,
                }
            except JournalFormatError as error:
                problem = {
                    "kind": "format",
                    "segment": str(error.path),
                    "offset": None,
                    "reason": error.reason,
                }
        summary = scanner.summary
        torn = summary.torn_tail
        watermark = summary.watermark
        result = {
            "ok": problem is None,
            **_summary_json(summary),
            "segment_records": dict(records_by_segment),
            "watermark": None
            if watermark is None
            else {"state": watermark.state.name.lower(), "first_seq": watermark.first_seq},
            "torn_tail": torn_tail_json(torn),
            # journal records (a run of entries is one) a torn tail kept from replay
            "records_dropped": 0 if torn is None else torn.records_dropped,
            "dropped_because": None if torn is None else _DROPPED_BECAUSE[torn.kind],
            "problem": problem,
        }
        if args.json:
            print_json(result)
        else:
            _print_verify(result)
        return EXIT_OK if problem is None else EXIT_PROBLEMS


#: why a torn tail's records are dropped, by `TornTail.kind`
_DROPPED_BECAUSE: dict[str, str] = {
    "incomplete": "torn tail: incomplete",
    "zeroed": "torn tail: zeroed",
    "stale": "torn tail: never written (a recycled segment's old bytes)",
    "checksum": "torn tail: checksum mismatch",
}


def _dropped_text(result: dict[str, Any]) -> str:
    dropped, because = result["records_dropped"], result["dropped_because"]
    if because is None:
        return "0"
    return f"{'an unknown number' if dropped is None else dropped} ({because})"


def _print_verify(result: dict[str, Any]) -> None:
    torn = result["torn_tail"]
    problem = result["problem"]
    watermark = result["watermark"]
    fields: list[tuple[str, object]] = [
        ("segments", result["segments"]),
        ("batches", result["batches"]),
        ("records", f"{result['records']} ({result['record_bytes']} bytes)"),
        ("seqs", f"{result['first_seq']}..{result['last_seq']}" if result["records"] else "none"),
        (
            "watermark",
            "none (a data dir older than version 6)"
            if watermark is None
            else f"{watermark['state']} from seq {watermark['first_seq']}",
        ),
        (
            "torn tail",
            "none"
            if torn is None
            else f"{torn['message']}. After a crash this is normal and `pora recover` ends "
            "there; if the node did not crash, suspect the disk and compare those ledgers "
            "with their replicas",
        ),
        ("records dropped", _dropped_text(result)),
    ]
    if problem is None:
        fields.append(("result", "OK"))
    else:
        where = problem["segment"]
        if problem["offset"] is not None:
            where += f" at byte {problem['offset']}"
        fields.append(("result", f"{problem['kind'].upper()}: {where}: {problem['reason']}"))
        section = "The journal has a gap" if problem["kind"] == "gap" else "Journal corruption"
        fields.append(("what to do", f"see docs/operations.md, '{section}'"))
    print_fields(fields)
