"""`pora.errors` gathers every public error type, and `pora` re-exports them."""

from __future__ import annotations

import inspect

import journal.errors
import ledger.errors
import netio.errors
import pora
import pora.client.replication.errors
import pora.errors
import pora.meta.errors


def test_every_error_of_the_error_modules_is_in_pora_errors_and_pora() -> None:
    for module in (
        journal.errors,
        ledger.errors,
        netio.errors,
        pora.meta.errors,
        pora.client.replication.errors,
    ):
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException):
                if value.__module__ != module.__name__:
                    continue  # imported there, defined elsewhere
                assert getattr(pora.errors, name) is value, name
                assert getattr(pora, name) is value, name
    for name in pora.errors.__all__:
        assert issubclass(getattr(pora.errors, name), pora.PoraError), name
        assert name in pora.__all__, name
