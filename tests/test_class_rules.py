"""The per-node client is built by composition: no class in `pora.client` stands on
more than `BASES_MAX` classes of the project. A deeper chain spreads one object
over several modules, each base declaring attributes only a subclass sets; the
client instead holds its parts (`NodeClient` holds a `NodeConnection`, which
holds its `Admission` and its `DeadlineSweep`)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pora.client

BASES_MAX = 2

#: the packages whose classes count as bases (the standard library's and the
#: dependencies' do not: an error type stands on Exception as any does)
PROJECT = ("journal", "ledger", "netio", "pora", "spark")


def _client_classes() -> list[type]:
    found: list[type] = []
    for module_info in pkgutil.walk_packages(pora.client.__path__, "pora.client."):
        module = importlib.import_module(module_info.name)
        for _name, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == module.__name__:
                found.append(value)
    return found


def project_bases(cls: type, packages: tuple[str, ...] = PROJECT) -> list[str]:
    """The classes of `packages` that `cls` stands on, nearest first."""
    return [
        f"{base.__module__}.{base.__qualname__}"
        for base in cls.__mro__[1:]
        if base.__module__.split(".")[0] in packages
    ]


def test_no_client_class_stands_on_more_than_two_of_the_project() -> None:
    classes = _client_classes()
    assert any(cls.__name__ == "NodeClient" for cls in classes)  # the walk sees them
    deep = {
        f"{cls.__module__}.{cls.__qualname__}": project_bases(cls)
        for cls in classes
        if len(project_bases(cls)) > BASES_MAX
    }
    assert deep == {}


def test_the_rule_counts_every_base_of_a_chain_and_only_the_projects() -> None:
    class Sweeper:
        pass

    class Connection(Sweeper):
        pass

    class Requests(Connection):
        pass

    class Client(Requests, Exception):
        pass

    assert project_bases(Client, (__name__,)) == [
        f"{__name__}.{name}"
        for name in (
            "test_the_rule_counts_every_base_of_a_chain_and_only_the_projects.<locals>.Requests",
            "test_the_rule_counts_every_base_of_a_chain_and_only_the_projects.<locals>.Connection",
            "test_the_rule_counts_every_base_of_a_chain_and_only_the_projects.<locals>.Sweeper",
        )
    ]
