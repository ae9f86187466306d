"""The `pora` command line. Each subcommand lives in its own module under pora/commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pora import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pora",
        description="Pora: a durable, replicated ledger store. Run a node, inspect and "
        "repair its data dir.",
    )
    parser.add_argument("--version", action="version", version=f"pora {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
