"""`pora verify --rebuild-index` cut short (killed part way through the entry logs):
the node must not start on the part of an index it leaves, where the ledgers not yet
rebuilt would read as never stored; a second rebuild finishes the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from cli_support import (
    CLOSED_LEDGER,
    ENTRIES_PER_LEDGER,
    FENCED_LEDGER,
    OPEN_LEDGER,
    SEAL_AT,
    SEALED_LEDGER,
    make_data_dir,
    payload,
    run_cli,
)

import pora
import pora.tools.rebuild
from pora.node.datadir import IndexMissing

Capsys = pytest.CaptureFixture[str]


class Killed(BaseException):
    """Stands for the SIGKILL: nothing after it runs, the files stay as they are."""


def rebuild_killed_after_one_ledger(
    data_dir: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    rebuild_ledger = pora.tools.rebuild._rebuild_ledger
    rebuilt: list[object] = []

    def killed_on_the_second(*args: Any, **kwargs: Any) -> None:
        if rebuilt:
            raise Killed
        rebuilt.append(rebuild_ledger(*args, **kwargs))

    with monkeypatch.context() as patch:
        patch.setattr(pora.tools.rebuild, "_rebuild_ledger", killed_on_the_second)
        with pytest.raises(Killed):
            run_cli(capsys, "verify", "--rebuild-index", "--data-dir", str(data_dir))
    assert rebuilt


def test_a_node_refuses_the_part_of_an_index_an_interrupted_rebuild_left(
    data_dir: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_data_dir(data_dir)
    rebuild_killed_after_one_ledger(data_dir, capsys, monkeypatch)

    async def start() -> None:
        async with pora.open_node(data_dir):
            pass

    with pytest.RaisesGroup(IndexMissing, allow_unwrapped=True, flatten_subgroups=True):
        trio.run(start)
    verified = run_cli(capsys, "verify", "--data-dir", str(data_dir))
    assert verified.status == 1 and "--rebuild-index" in verified.err

    again = run_cli(capsys, "verify", "--rebuild-index", "--data-dir", str(data_dir))
    assert again.status == 0, again.out + again.err
    assert not (data_dir / "index.rebuilding").exists()

    async def read_all() -> None:
        async with pora.open_node(data_dir) as node:
            for ledger_id in (OPEN_LEDGER, CLOSED_LEDGER, FENCED_LEDGER, SEALED_LEDGER):
                last = SEAL_AT if ledger_id == SEALED_LEDGER else ENTRIES_PER_LEDGER - 1
                assert await node.last_entry_id(ledger_id) == last
                for entry_id in range(last + 1):
                    got = await node.read_entry(ledger_id, entry_id)
                    assert got == payload(ledger_id, entry_id)

    trio.run(read_all)
