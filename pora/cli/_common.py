"""What the operator commands share: the common options, opening a data dir offline
(refusing one that a running node holds, that is not a Pora data dir, or whose format
version this build does not know), tables, JSON, and turning errors into exit statuses.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from journal.errors import PoraError
from ledger.index import Index, IndexDamaged, IndexOpenError
from pora.node.datadir import DataDir, DataDirError, DataDirLock, DataDirLocked, open_data_dir
from pora.tools.inspection import find_entry_logs

#: the command ran and everything is fine
EXIT_OK: Final = 0
#: the command ran and found problems (corruption, damage, data not yet replayed)
EXIT_PROBLEMS: Final = 1
#: the command could not run: bad arguments, not a data dir, in use, unknown version
EXIT_REFUSED: Final = 2

DEFAULT_DATA_DIR: Final = Path("pora-data")

Run = Callable[[argparse.Namespace], int]


class CommandError(Exception):
    """Ends a command with a message on stderr and the given exit status."""

    def __init__(self, message: str, exit_status: int = EXIT_PROBLEMS) -> None:
        super().__init__(message)
        self.message = message
        self.exit_status = exit_status


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--data-dir and --json, the same for every command."""
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        metavar="DIR",
        help="the node's data directory (default: ./pora-data); the node must be stopped",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON for scripts instead of tables"
    )


def command(run: Run) -> Run:
    """Wraps a command's run function: errors become a message and an exit status."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except KeyboardInterrupt:
            return fail("interrupted", 130)
        except BrokenPipeError:
            # the reader went away (`| head`): stop quietly, and let nothing more be
            # written to the closed pipe when Python flushes stdout at exit
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return EXIT_PROBLEMS
        except (CommandError, PoraError, BaseExceptionGroup) as error:
            # the node's nurseries wrap what its tasks raised (recovery errors, say)
            leaves = _leaf_exceptions(error) if isinstance(error, BaseExceptionGroup) else [error]
            if not all(isinstance(leaf, CommandError | PoraError) for leaf in leaves):
                raise
            for leaf in leaves[:-1]:
                fail(_message(leaf))
            return fail(_message(leaves[-1]), max(_exit_status(leaf) for leaf in leaves))

    return wrapper


def _message(error: BaseException) -> str:
    return error.message if isinstance(error, CommandError) else str(error)


def _exit_status(error: BaseException) -> int:
    if isinstance(error, CommandError):
        return error.exit_status
    if isinstance(error, DataDirError):  # e.g. a node took the lock after our check
        return EXIT_REFUSED
    return EXIT_PROBLEMS


def pora_error_message(error: BaseException) -> str | None:
    """The message of a PoraError, or of the PoraErrors an exception group holds (the
    node's nurseries wrap what its tasks raise), each distinct message once (tasks
    that failed alike say it once); None if it holds anything else."""
    leaves = _leaf_exceptions(error) if isinstance(error, BaseExceptionGroup) else [error]
    if not all(isinstance(leaf, PoraError) for leaf in leaves):
        return None
    return "; ".join(dict.fromkeys(str(leaf) for leaf in leaves))


def _leaf_exceptions(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    leaves: list[BaseException] = []
    for inner in group.exceptions:
        if isinstance(inner, BaseExceptionGroup):
            leaves.extend(_leaf_exceptions(inner))
        else:
            leaves.append(inner)
    return leaves


def fail(message: str, exit_status: int = EXIT_PROBLEMS) -> int:
    print(f"pora: error: {message}", file=sys.stderr)
    return exit_status


def warn(message: str) -> None:
    print(f"pora: warning: {message}", file=sys.stderr)


# --- opening a data dir offline ------------------------------------------------------------


def check_data_dir(root: Path) -> DataDir:
    """The data dir at `root`, or CommandError if it is not one this build can use."""
    try:
        return open_data_dir(root, create=False)
    except DataDirError as error:
        raise CommandError(str(error), EXIT_REFUSED) from error


@contextlib.contextmanager
def offline_data_dir(root: Path) -> Iterator[DataDir]:
    """The data dir at `root`, locked against a node starting on it meanwhile.

    Refuses (CommandError, EXIT_REFUSED) a dir a running node holds, a dir that is
    not a Pora data dir, and one of an unknown format version.
    """
    directory = check_data_dir(root)
    lock = DataDirLock(directory.root)
    try:
        lock.acquire()
    except DataDirLocked as error:
        raise CommandError(
            f"{error}. Operator commands work on a stopped node only", EXIT_REFUSED
        ) from error
    try:
        yield directory
    finally:
        lock.release()


def ensure_not_locked(directory: DataDir) -> None:
    """Refuse a data dir a running node holds (without keeping the lock)."""
    with offline_data_dir(directory.root):
        pass


def open_index(directory: DataDir) -> Index:
    """The existing index of `directory`, read-only: opened on a private copy, so that
    inspecting changes no byte of it (LevelDB writes at every open, and would drop a
    damaged log file: the evidence). Never creates one (an empty index next to
    existing entry logs would hide every ledger)."""
    if not (directory.index_dir / "CURRENT").exists():
        logs, _ = find_entry_logs(directory)
        if not logs:
            raise CommandError(
                f"{directory.root} has no index and no entry logs: the node never stored "
                "anything (nothing to inspect)",
                EXIT_PROBLEMS,
            )
        raise CommandError(
            f"the index {directory.index_dir} is missing (no LevelDB CURRENT file). If the "
            "node ever stored data, its index was lost: rebuild it from the entry logs and "
            "the journal with `pora verify --rebuild-index`",
            EXIT_PROBLEMS,
        )
    try:
        return Index.open_copy(directory.index_dir)
    except IndexDamaged as error:
        raise CommandError(str(error), EXIT_PROBLEMS) from error
    except IndexOpenError as error:
        raise CommandError(
            f"{error}. If the index is damaged, rebuild it with `pora verify --rebuild-index`",
            EXIT_PROBLEMS,
        ) from error


# --- output ------------------------------------------------------------------------------


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def print_json_line(value: Any) -> None:
    print(json.dumps(value, separators=(",", ":")))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [len(name) for name in columns]
    for row in cells:
        for position, cell in enumerate(row):
            widths[position] = max(widths[position], len(cell))
    numeric = [
        all(isinstance(row[position], int) for row in rows) and bool(rows)
        for position in range(len(columns))
    ]

    def line(values: Sequence[str], *, header: bool = False) -> str:
        padded = [
            value.rjust(widths[i]) if numeric[i] and not header else value.ljust(widths[i])
            for i, value in enumerate(values)
        ]
        return "  ".join(padded).rstrip()

    print(line(columns, header=True))
    for row in cells:
        print(line(row))


class TableWriter:
    """A table printed as rows arrive, for output too long to hold in memory: column
    widths come from the first `buffer_rows` rows (later, wider cells widen the
    columns from there on)."""

    def __init__(self, columns: Sequence[str], *, buffer_rows: int = 1000) -> None:
        self._columns = list(columns)
        self._buffer_rows = buffer_rows
        self._rows: list[list[str]] = []
        self._widths: list[int] | None = None

    def add(self, row: Sequence[object]) -> None:
        self._rows.append([str(cell) for cell in row])
        if len(self._rows) >= self._buffer_rows:
            self.flush()

    def flush(self) -> None:
        if self._widths is None:
            self._widths = [len(name) for name in self._columns]
            print(self._line(self._columns, self._rows))
        else:
            self._line([], self._rows)  # widen for these rows
        for row in self._rows:
            print(self._line(row, []))
        self._rows = []

    def _line(self, values: Sequence[str], also: list[list[str]]) -> str:
        assert self._widths is not None
        for row in also:
            for position, cell in enumerate(row):
                self._widths[position] = max(self._widths[position], len(cell))
        return "  ".join(v.ljust(w) for v, w in zip(values, self._widths, strict=False)).rstrip()


def print_fields(fields: Sequence[tuple[str, object]]) -> None:
    """`name: value` lines, names aligned."""
    width = max((len(name) for name, _ in fields), default=0)
    for name, value in fields:
        print(f"{name.ljust(width)}  {value}")
