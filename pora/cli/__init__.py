"""The `pora` command line.

Each subcommand (or group of subcommands) lives in its own module of this
package and exposes `register(subparsers)`, which adds its parser and sets
`run` (a function of the parsed arguments returning the exit status) as a default.
Modules are found by listing the package, so adding a command touches one file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable, Sequence
from typing import cast

import pora.cli
from pora import __version__

Run = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pora",
        description="Pora: a durable, replicated ledger store. Run a node, inspect and "
        "repair its data dir.",
    )
    parser.add_argument("--version", action="version", version=f"pora {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(pora.cli.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue  # helpers shared by commands
        module = importlib.import_module(f"pora.cli.{module_info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    run = cast("Run | None", getattr(args, "run", None))
    if run is None:
        parser.print_help()
        return 2
    return run(args)
