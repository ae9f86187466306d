"""`pora serve`: run a node daemon (see `pora.daemon` and `pora.settings`)."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
from pathlib import Path
from typing import Any

import trio

from journal.errors import PoraError
from ledger.index import IndexDamaged
from pora.datadir import IndexMissing
from pora.settings import SETTINGS, SettingsError, load_settings

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
    from pora.daemon import run_daemon  # noqa: PLC0415 (keeps `--help` fast)
    from pora.logs import configure_logging  # noqa: PLC0415

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
    except (PoraError, BaseExceptionGroup) as error:
        # data dir locked or unusable, journal corrupt, ...: say what, not a traceback
        reasons = _pora_errors(error)
        if reasons is None:
            raise
        for reason in reasons:
            logging.getLogger("pora.serve").error(  # noqa: TRY400 (a reason, not a bug)
                "cannot serve: %s", reason, extra={"fields": {"error": type(reason).__name__}}
            )
        # a data dir the node must not start on as it is (the operator repairs it first)
        refused = all(isinstance(reason, IndexMissing | IndexDamaged) for reason in reasons)
        return 2 if refused else 1


def _pora_errors(error: BaseException) -> list[PoraError] | None:
    """The PoraErrors `error` consists of (through exception groups), or None if
    anything else is in there (a bug: let its traceback show)."""
    if isinstance(error, PoraError):
        return [error]
    if isinstance(error, BaseExceptionGroup):
        found: list[PoraError] = []
        for inner in error.exceptions:
            errors = _pora_errors(inner)
            if errors is None:
                return None
            found.extend(errors)
        return found
    return None
