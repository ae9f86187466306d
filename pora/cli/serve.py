"""`pora serve`: run a node daemon (see `pora.daemon` and `pora.settings`)."""

from __future__ import annotations

import argparse
import errno
import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Final

import trio

from journal.errors import JournalNoSpace, PoraError
from ledger.index import IndexOpenError
from pora.cli._common import EXIT_REFUSED
from pora.node.datadir import DataDirError, IndexMissing
from pora.server.settings import SETTINGS, SettingsError, load_settings

EPILOG = """\
Each setting can also come from an environment variable (shown in brackets) or
from the TOML file given by --config (or PORA_CONFIG), as a top-level key of the
same name. Node options go in a [node] table (any pora.NodeConfig knob, like
group_wait_ms_max or memtable_flush_bytes), network server options in a [server]
table; PORA_NODE_<NAME> / PORA_SERVER_<NAME> variables and repeated --node-option /
--server-option flags set them too. Precedence: flags > environment > file >
defaults. Sizes accept units (512MiB, 2GB). Full table: docs/configuration.md.

Signals: SIGINT or SIGTERM stops accepting connections, lets in-flight requests
finish (up to --drain-timeout-s), flushes and closes the node, and exits 0 (1 if
a ledger could not be flushed, a full disk: its journal is kept for the next
start); a second signal cuts the drain short.
"""


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run a node: serve the Pora protocol over TCP",
        description="Run a Pora node on a data dir and serve it over the network. "
        "Startup runs recovery (replays the journal); progress goes to the log.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="TOML config file [PORA_CONFIG] (default: none)",
    )
    for setting in SETTINGS:
        parser.add_argument(
            setting.flag,
            dest=setting.name,
            default=None,
            metavar=setting.metavar,
            help=f"{setting.help} [{setting.env}] (default: {setting.default_text})",
        )
    parser.add_argument(
        "--node-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set one node option (repeatable), like group_wait_ms_max=2",
    )
    parser.add_argument(
        "--server-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set one network server option (repeatable)",
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="once serving, write the bound addresses there as JSON (for scripts and tests)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pora.server.daemon import run_daemon  # noqa: PLC0415 (keeps `--help` fast)
    from pora.server.logs import configure_logging  # noqa: PLC0415

    flags = {s.name: getattr(args, s.name) for s in SETTINGS}
    try:
        settings = load_settings(
            flags,
            config_path=args.config,
            node_option_flags=args.node_option,
            server_option_flags=args.server_option,
        )
    except SettingsError as error:
        print(f"pora serve: {error}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    ready_file: Path | None = args.ready_file

    def on_ready(addresses: dict[str, Any]) -> None:
        if ready_file is not None:
            temporary = ready_file.with_name(ready_file.name + ".tmp")
            temporary.write_text(json.dumps(addresses))
            temporary.replace(ready_file)  # readers never see half a file

    try:
        return trio.run(functools.partial(run_daemon, settings, on_ready=on_ready))
    except (PoraError, OSError, BaseExceptionGroup) as error:
        # data dir locked or unusable, no room for the journal, journal corrupt, ...:
        # say what, not a traceback
        reasons = _reasons(error)
        if reasons is None:
            raise
        for reason in reasons:
            logging.getLogger("pora.serve").error(  # noqa: TRY400 (a reason, not a bug)
                "cannot serve: %s",
                _describe(reason),
                extra={"fields": {"error": type(reason).__name__}},
            )
        return EXIT_REFUSED if all(_is_refusal(reason) for reason in reasons) else 1


#: errors of the machine around the node, not of Pora: said in words, never a traceback
_ENVIRONMENT_ERRNOS: Final = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def _reasons(error: BaseException) -> list[Exception] | None:
    """The errors `error` consists of (through exception groups) if each is a
    PoraError or a fault of the machine (permissions, a full or read-only disk);
    None if anything else is in there (a bug: let its traceback show)."""
    if isinstance(error, PoraError):
        return [error]
    if isinstance(error, OSError) and error.errno in _ENVIRONMENT_ERRNOS:
        return [error]
    if isinstance(error, BaseExceptionGroup):
        found: list[Exception] = []
        for inner in error.exceptions:
            reasons = _reasons(inner)
            if reasons is None:
                return None
            found.extend(reasons)
        return found
    return None


def _describe(reason: Exception) -> str:
    if not isinstance(reason, OSError):
        return str(reason)
    where = f" on {reason.filename}" if reason.filename else ""
    if reason.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{reason.strerror}{where}: free space on that filesystem, then start again"
    return (
        f"{reason.strerror}{where} (running as uid {os.geteuid()}): run the node as the "
        "user that owns the data dir, or give this user write access to it"
    )


def _is_refusal(reason: Exception) -> bool:
    """Whether the node refused to start as configured (exit status 2) rather than
    failed (1): a bad data dir, address, or too little room, or a data dir the node
    must not start on as it is (a lost or damaged index, or one that cannot be
    opened: its disk full, its files not this user's), all repaired outside."""
    from pora.server.daemon import StartRefused  # noqa: PLC0415 (loaded by `run` already)
    from pora.server.registration import RegistrationRefused  # noqa: PLC0415

    return isinstance(
        reason,
        DataDirError
        | JournalNoSpace
        | StartRefused
        | RegistrationRefused
        | OSError
        | IndexMissing
        | IndexOpenError,
    )
