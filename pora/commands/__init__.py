"""Subcommands of `pora`: one module each, found by `pora.cli` (see its docstring)."""
