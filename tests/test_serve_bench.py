"""`pora bench` end to end, briefly: a served node, the load, the JSON report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest


@pytest.mark.parametrize("with_redis", [False, True])
def test_bench_reports_adds_per_second_and_latency(with_redis: bool) -> None:
    if with_redis and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    command = [
        sys.executable, "-m", "pora.cli", "bench", "--json", "--connections", "2",
        "--depth", "8", "--duration-s", "1.0", "--warmup-s", "0.5", "--rounds", "2",
    ]  # fmt: skip
    # the warm-up takes the node's first-time costs (a fresh journal segment, the
    # ledgers' first adds) out of the measured second, which a slow machine needs
    if not with_redis:
        command.append("--no-redis")
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(result.stdout)
    assert len(report["pora_rounds"]) == 2
    assert report["pora"] in report["pora_rounds"]  # the median round
    assert all(r["ops"] > 0 for r in report["pora_rounds"])
    assert report["pora"]["errors"] == 0
    assert 0 < report["pora"]["p50_ms"] <= report["pora"]["p99_ms"] <= report["pora"]["p999_ms"]
    assert report["pora"]["mb_per_s"] == pytest.approx(report["pora"]["ops_per_s"] * 1024 / 1e6)
    if with_redis:
        assert report["redis"]["ops"] > 0
        assert len(report["redis_rounds"]) == 2
        assert report["ratio"] == pytest.approx(
            report["pora"]["ops_per_s"] / report["redis"]["ops_per_s"]
        )
    else:
        assert report["redis"] is None
        assert "--no-redis" in report["redis_skipped"]


def test_bench_says_clearly_when_redis_is_absent() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "bench", "--duration-s", "0.3", "--warmup-s", "0",
         "--connections", "1", "--depth", "4"],
        capture_output=True, text=True, timeout=120, check=True,
        env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert "redis-server is not on PATH: Redis comparison skipped" in result.stdout
    assert "adds/s" in result.stdout
