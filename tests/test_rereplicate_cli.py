"""The re-replication commands' edges, in process (docs/rereplication.md, "The
commands"): a store that is not there, bad numbers, an empty cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from cli_support import run_cli

from pora.meta.backends import open_metadata


def test_a_missing_store_is_refused_with_exit_status_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/nothing.db"
    for argv in (
        ("audit", "--metadata", url),
        ("rereplicate", "--metadata", url),
        ("node", "decommission", "127.0.0.1:1", "--metadata", url),
    ):
        result = run_cli(capsys, *argv)
        assert result.status == 2, argv
        assert "pora serve --metadata" in result.err
    assert not (tmp_path / "nothing.db").exists()  # never created


@pytest.mark.parametrize(
    "option", [("--entries-per-s", "-1"), ("--bytes-per-s", "fast"), ("--batch-entries", "0"),
               ("--lock-lease-s", "0"), ("--lost-after-s", "inf")],
)  # fmt: skip
def test_bad_numbers_are_refused_by_name(
    capsys: pytest.CaptureFixture[str], option: tuple[str, str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        run_cli(capsys, "rereplicate", "--metadata", "sqlite:x.db", *option)
    assert exit_.value.code == 2
    assert option[0] in capsys.readouterr().err


def test_an_empty_cluster_is_clean(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"

    async def make() -> None:
        async with open_metadata(url):
            pass

    trio.run(make)
    audit = run_cli(capsys, "audit", "--metadata", url, "--json")
    assert audit.status == 0
    assert audit.json() == {
        "metadata": url, "ledgers": 0, "fragments": 0, "under_replicated": [],
    }  # fmt: skip
    repair = run_cli(capsys, "rereplicate", "--metadata", url, "--json")
    assert repair.status == 0
    assert repair.json_lines()[-1]["fragments_repaired"] == 0
    drain = run_cli(capsys, "node", "decommission", "127.0.0.1:9", "--metadata", url)
    assert drain.status == 2
    assert "no node is registered at 127.0.0.1:9" in drain.err
