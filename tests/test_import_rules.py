"""The import direction of the rooms (docs/architecture.md, "The rooms"), checked by
walking every module's imports with `ast`: bottom to top, `journal`, `ledger` and
`netio` know nothing of `pora` nor of each other's internals; `pora.node` composes
journal and ledger and knows no wire format; `pora.client` speaks `netio` and never
touches the node or the server.

A rule is about what a module's own source imports (at any depth of the file, under
`TYPE_CHECKING` too: a type from a room is knowledge of that room). Importing
`x.y` also runs `x/__init__.py`; that package facade is not counted against the
importer, since `pora/__init__.py` is the public face of every room by design.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("journal", "ledger", "netio", "pora", "spark")

#: the only modules of `journal` and `ledger` that the wire side (`netio`, the client)
#: may know: the typed errors a remote failure is raised as
ERROR_MODULES = ("journal.errors", "ledger.errors")

#: what the client takes from `journal` besides the errors, on purpose, and why
CLIENT_USES_OF_JOURNAL = {
    "journal.parking": "the parking of one task under trio, which the node's in-process "
    "adds use too: one parker, in the lowest room both stand on",
}

#: what `ledger` takes from `journal` on purpose, and why
LEDGER_USES_OF_JOURNAL = {
    "journal.errors": "PoraError and JournalError are the root of every engine error",
    "journal.request": "the journal hands each ledger's worker its Requests to apply",
    "journal.format": "an entry-log record is byte for byte the journal's record body "
    "(the body layout and its checksum are defined once)",
    "journal.fileio": "the small file primitives (pwrite_all, fsync of a folder) every "
    "storage file needs, defined once in the lowest room",
}


@dataclass(frozen=True)
class Import:
    importer: str  # the module whose source holds the import statement
    imported: str  # the module it names, resolved to a module where one exists
    line: int

    def __str__(self) -> str:
        return f"{self.importer} imports {self.imported} (line {self.line})"


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(root: Path, name: str) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports_of(root: Path, path: Path) -> list[Import]:
    importer = _module_name(root, path)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(importer, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb from the importer's package
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                # `from netio import frames` names the module netio.frames
                submodule = f"{source}.{alias.name}"
                imported = submodule if _is_module(root, submodule) else source
                found.append(Import(importer, imported, node.lineno))
    return found


def project_imports(root: Path = ROOT) -> list[Import]:
    """Every import of a first-party module by a module of the project's packages."""
    found: list[Import] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found += [i for i in _imports_of(root, path) if i.imported.split(".")[0] in PACKAGES]
    return found


def _within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _breaches(imports: list[Import], rule: str) -> list[str]:
    return [str(i) for i in imports if RULES[rule](i)]


RULES: dict[str, Callable[[Import], bool]] = {
    "journal, ledger and netio never import pora": lambda i: (
        _within(i.importer, "journal", "ledger", "netio") and _within(i.imported, "pora")
    ),
    "journal knows nothing of ledger or netio": lambda i: (
        _within(i.importer, "journal") and _within(i.imported, "ledger", "netio")
    ),
    "ledger knows nothing of netio, and of journal only what it shares on purpose": (
        lambda i: (
            _within(i.importer, "ledger")
            and (
                _within(i.imported, "netio")
                or (_within(i.imported, "journal") and i.imported not in LEDGER_USES_OF_JOURNAL)
            )
        )
    ),
    "netio imports nothing of journal or ledger but their errors": lambda i: (
        _within(i.importer, "netio")
        and _within(i.imported, "journal", "ledger")
        and i.imported not in ERROR_MODULES
    ),
    "pora.node never imports netio": lambda i: (
        _within(i.importer, "pora.node") and _within(i.imported, "netio")
    ),
    "pora.node never imports the rooms above it": lambda i: (
        _within(i.importer, "pora.node")
        and _within(i.imported, "pora.server", "pora.client", "pora.cli", "pora.tools")
    ),
    "pora.client never imports pora.node or pora.server": lambda i: (
        _within(i.importer, "pora.client") and _within(i.imported, "pora.node", "pora.server")
    ),
    "the per-node client (pora.client but replication) imports nothing of replication or meta": (
        lambda i: (
            _within(i.importer, "pora.client")
            and not _within(i.importer, "pora.client.replication")
            and _within(i.imported, "pora.client.replication", "pora.meta")
        )
    ),
    "pora.client imports nothing of journal or ledger but their errors and the parker": (
        lambda i: (
            _within(i.importer, "pora.client")
            and _within(i.imported, "journal", "ledger")
            and i.imported not in ERROR_MODULES
            and i.imported not in CLIENT_USES_OF_JOURNAL
        )
    ),
    "pora.cluster_ops works through the client and the store, never a node's insides": (
        lambda i: (
            _within(i.importer, "pora.cluster_ops")
            and _within(i.imported, "pora.node", "pora.server", "pora.cli", "pora.tools")
        )
    ),
    "nothing below pora.cluster_ops imports it": lambda i: (
        _within(i.imported, "pora.cluster_ops")
        and not _within(i.importer, "pora.cluster_ops", "pora.cli")
    ),
    "spark uses only the public client": lambda i: (
        _within(i.importer, "spark")
        and (
            _within(i.imported, "journal", "ledger", "netio")
            or (
                _within(i.imported, "pora")
                and i.imported != "pora"
                and not _within(i.imported, "pora.client")
            )
        )
    ),
}


#: the replicating client's pure room (docs/architecture.md): decisions and state
#: machines that do no I/O, never await and read no clock, driven by tests without an
#: event loop
PURE_ROOM = "pora.client.replication.core"

#: what a module of the pure room may never import: event loops, sockets, files,
#: processes, threads, clocks, the stores' drivers
IO_MODULES = (
    "anyio",
    "trio",
    "asyncio",
    "socket",
    "selectors",
    "select",
    "ssl",
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "mmap",
    "fcntl",
    "subprocess",
    "threading",
    "multiprocessing",
    "concurrent",
    "signal",
    "time",
    "sqlite3",
    "plyvel",
    "kazoo",
)

#: the project's modules the pure room may use besides its own, and why: value types
PURE_ROOM_USES = {
    "pora.client.replication.errors": "the client's typed errors",
    "pora.meta.records": "ledger records, ensembles and members as values",
    "ledger.errors": "the engine's typed errors the client raises as they are",
    "journal.errors": "the root of every engine error",
    "pora.client.batch": "the one type of a ledger's batch for a node",
}


def pure_room_breaches(root: Path = ROOT) -> list[str]:
    """Every import by a module of `PURE_ROOM` of an I/O module, or of a project
    module outside the room but for `PURE_ROOM_USES`."""
    breaches: list[str] = []
    for path in sorted(root.joinpath(*PURE_ROOM.split(".")).rglob("*.py")):
        for found in _imports_of(root, path):
            first_party = found.imported.split(".")[0] in PACKAGES
            if _within(found.imported, *IO_MODULES) or (
                first_party
                and not _within(found.imported, PURE_ROOM)
                and found.imported not in PURE_ROOM_USES
            ):
                breaches.append(str(found))
    return breaches


def test_the_pure_room_does_no_io() -> None:
    assert pure_room_breaches() == []


def test_the_pure_room_rule_catches_io(tmp_path: Path) -> None:
    """An event loop, a socket, a file or clock, or an I/O module of the client
    imported by the pure room, directly or nested in a function, is a breach."""
    room = tmp_path.joinpath(*PURE_ROOM.split("."))
    room.mkdir(parents=True)
    for package in (room, *room.parents):
        if package == tmp_path:
            break
        (package / "__init__.py").write_text("")
    (tmp_path / "pora" / "client" / "replication" / "writer.py").write_text("")
    (room / "fine.py").write_text(
        "import enum\nfrom pora.meta.records import Ensemble\nfrom . import other\n"
    )
    (room / "other.py").write_text("")
    (room / "loops.py").write_text("import anyio\nfrom trio import lowlevel\n")
    (room / "files.py").write_text("def f():\n    import os\n    from time import monotonic\n")
    (room / "upward.py").write_text("from pora.client.replication import writer\n")
    assert pure_room_breaches(tmp_path) == [
        "pora.client.replication.core.files imports os (line 2)",
        "pora.client.replication.core.files imports time (line 3)",
        "pora.client.replication.core.loops imports anyio (line 1)",
        "pora.client.replication.core.loops imports trio (line 2)",
        "pora.client.replication.core.upward imports pora.client.replication.writer (line 1)",
    ]


@pytest.fixture(scope="module")
def walked() -> list[Import]:
    """The project's imports, walked once for the module: the tests only read them."""
    return project_imports()


@pytest.mark.parametrize("rule", list(RULES))
def test_the_house_keeps_its_import_direction(walked: list[Import], rule: str) -> None:
    assert _breaches(walked, rule) == []


def test_the_walk_sees_the_imports_it_judges(walked: list[Import]) -> None:
    """The rules above pass vacuously if the walk finds nothing: it finds what is there."""
    imports = {(i.importer, i.imported) for i in walked}
    assert ("pora.server.server", "netio.codec") in imports
    assert ("pora.node.node", "journal.request") in imports
    assert ("ledger.registry", "journal.request") in imports
    # every deliberate use of journal by ledger is one ledger still makes
    used = {imported for importer, imported in imports if _within(importer, "ledger")}
    assert set(LEDGER_USES_OF_JOURNAL) <= used
    used = {imported for importer, imported in imports if _within(importer, "pora.client")}
    assert set(CLIENT_USES_OF_JOURNAL) <= used


def test_each_kind_of_import_is_caught(tmp_path: Path) -> None:
    """A plain, a from-, a relative and a nested import of a forbidden room all count."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for room in ("client", "node", "server"):
        (tmp_path / "pora" / room).mkdir()
        (tmp_path / "pora" / room / "__init__.py").write_text("")
        (tmp_path / "pora" / room / f"{room}_module.py").write_text("")
    (tmp_path / "journal" / "request.py").write_text("")
    (tmp_path / "netio" / "codec.py").write_text("from journal.request import Request\n")
    (tmp_path / "pora" / "client" / "a.py").write_text("import pora.node.node_module\n")
    (tmp_path / "pora" / "client" / "b.py").write_text("from pora.server import server_module\n")
    (tmp_path / "pora" / "client" / "c.py").write_text("from ..node import node_module\n")
    (tmp_path / "pora" / "node" / "d.py").write_text("def f():\n    import netio.codec\n")
    imports = project_imports(tmp_path)
    assert _breaches(imports, "pora.client never imports pora.node or pora.server") == [
        "pora.client.a imports pora.node.node_module (line 1)",
        "pora.client.b imports pora.server.server_module (line 1)",
        "pora.client.c imports pora.node.node_module (line 1)",
    ]
    assert _breaches(imports, "pora.node never imports netio") == [
        "pora.node.d imports netio.codec (line 2)"
    ]
    assert _breaches(imports, "netio imports nothing of journal or ledger but their errors") == [
        "netio.codec imports journal.request (line 1)"
    ]
