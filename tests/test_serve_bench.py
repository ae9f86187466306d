"""`pora bench` end to end, briefly: a served node, the load, the JSON report; and the
load clients' bulk bookkeeping: RESP reply counting, send times, the window."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pora.bench.network import LoadConfig, SendTimes, Window
from pora.bench.resp import ReplyCounter, RespError


@pytest.mark.slow
@pytest.mark.parametrize("with_redis", [False, True])
def test_bench_reports_adds_per_second_and_latency(with_redis: bool) -> None:
    if with_redis and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    command = [
        sys.executable, "-m", "pora.cli", "bench", "--json", "--connections", "2",
        "--depth", "8", "--duration-s", "0.5", "--warmup-s", "0.5", "--rounds", "2",
        "--pora-load", "runs,frames",
    ]  # fmt: skip
    # the warm-up takes the node's first-time costs (a fresh journal segment, the
    # ledgers' first adds) out of the measured half second, which a slow machine
    # needs. The assertions need some adds in each measured round, not a long one
    if not with_redis:
        command.append("--no-redis")
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, check=True)
    report = json.loads(result.stdout)
    assert [system["load"] for system in report["pora"]] == ["runs", "frames"]
    for system in report["pora"]:
        median = system["median"]
        assert len(system["rounds"]) == 2
        assert median in system["rounds"]  # the median round
        assert all(r["ops"] > 0 for r in system["rounds"])
        assert median["errors"] == 0
        assert 0 < median["p50_ms"] <= median["p99_ms"] <= median["p999_ms"]
        assert median["mb_per_s"] == pytest.approx(median["ops_per_s"] * 1024 / 1e6)
        if with_redis:
            assert system["ratio"] == pytest.approx(
                median["ops_per_s"] / report["redis"]["median"]["ops_per_s"]
            )
        else:
            assert system["ratio"] is None
    assert report["pora"][0]["median"]["system"].startswith("pora ADD_RUN")
    assert report["pora"][1]["median"]["system"].startswith("pora ADD_ENTRY")
    if with_redis:
        assert report["redis"]["median"]["ops"] > 0
        assert len(report["redis"]["rounds"]) == 2
    else:
        assert report["redis"] is None
        assert "--no-redis" in report["redis_skipped"]


@pytest.mark.slow
def test_bench_refuses_an_unknown_load() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "bench", "--pora-load", "runs,bulk"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown --pora-load 'bulk'; choose from runs, frames, library" in result.stderr


def test_bench_refuses_an_unknown_node_option_before_starting_a_node() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "bench", "--no-redis",
         "--node-option", "sync_with_io_uring=true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "pora bench: unknown node option 'sync_with_io_uring'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_bench_says_clearly_when_redis_is_absent() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "bench", "--duration-s", "0.3", "--warmup-s", "0",
         "--connections", "1", "--depth", "4"],
        capture_output=True, text=True, timeout=120, check=True,
        env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert "redis-server is not on PATH: Redis comparison skipped" in result.stdout
    assert "adds/s" in result.stdout


# --- RESP reply counting ----------------------------------------------------------------------

#: a RESP reply as (its bytes, the error replies in it, nested ones included)
Reply = tuple[bytes, int]


def _bulk(data: bytes) -> Reply:
    return b"$%d\r\n%s\r\n" % (len(data), data), 0


def _line(data: bytes) -> bytes:
    return data.replace(b"\r", b"").replace(b"\n", b"")


#: XADD replies: ids of one millisecond, so that runs share a length (and change it)
xadd_ids = st.builds(
    lambda ms, seq: _bulk(b"%d-%d" % (ms, seq)),
    st.integers(1763900000000, 1763900000002),
    st.integers(0, 30),
)
leaves: st.SearchStrategy[Reply] = st.one_of(
    xadd_ids,
    st.binary(max_size=40).map(_bulk),  # any bytes, CR LF included
    st.just((b"$-1\r\n", 0)),
    st.binary(max_size=20).map(lambda m: (b"-ERR " + _line(m) + b"\r\n", 1)),
    st.integers(-(2**63), 2**63).map(lambda n: (b":%d\r\n" % n, 0)),
    st.binary(max_size=10).map(lambda m: (b"+" + _line(m) + b"\r\n", 0)),
)
replies: st.SearchStrategy[Reply] = st.recursive(
    leaves,
    lambda items: st.lists(items, max_size=4).map(
        lambda xs: (b"*%d\r\n" % len(xs) + b"".join(x for x, _ in xs), sum(e for _, e in xs))
    ),
    max_leaves=8,
)


class _GeneralParserOnly(ReplyCounter):
    """The reply counter without its fast path for runs of bulk strings."""

    def _skip_id_run(self, position: int) -> tuple[int, int]:
        return 0, position


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.lists(xadd_ids, max_size=60), replies.map(lambda r: [r])), max_size=15),
    st.lists(st.integers(0, 10**6), max_size=8),
)
@pytest.mark.slow
def test_reply_counts_match_the_general_parser_and_the_replies_sent(
    groups: list[list[Reply]], cuts: list[int]
) -> None:
    sent = [reply for group in groups for reply in group]
    stream = b"".join(data for data, _ in sent)
    reply_ends = []
    end = 0
    for data, _ in sent:
        end += len(data)
        reply_ends.append(end)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {len(stream)})
    fast, general = ReplyCounter(), _GeneralParserOnly()
    counted = 0
    start = 0
    for point in points:
        piece = stream[start:point]
        start = point
        replies_now = fast.feed(piece)
        assert replies_now == general.feed(piece)
        counted += replies_now
        # every reply wholly received is counted as soon as its last byte arrives
        assert counted == sum(1 for reply_end in reply_ends if reply_end <= point)
    assert counted == len(sent)
    assert fast.errors_total == general.errors_total == sum(errors for _, errors in sent)
    assert fast.errors == general.errors
    assert not fast.buffer


def test_a_run_of_xadd_replies_is_counted_with_its_error_replies() -> None:
    ids = [b"1763900000000-%d" % seq for seq in range(200)]  # lengths 15, 16 and 17
    stream = b"".join(b"$%d\r\n%s\r\n" % (len(i), i) for i in ids)
    stream += b"-OOM command not allowed\r\n" + stream
    counter = ReplyCounter()
    assert counter.feed(stream[:-3]) == 400  # the last reply is not whole yet
    assert counter.feed(stream[-3:]) == 1
    assert counter.errors_total == 1
    assert counter.errors == ["OOM command not allowed"]


def _outcome(counter: ReplyCounter, data: bytes) -> tuple[int, int] | str:
    try:
        return counter.feed(data), counter.errors_total
    except RespError as error:
        return f"RespError: {error}"


@pytest.mark.parametrize(
    "stream",
    [
        b"$16\r\n1763900000000-1\r\n$15\r\n1763900000000-2\r\n-ERR x\r\n:1\r\n",
        b"$14\r\n1763900000000-1\r\n$15\r\n1763900000000-2\r\n",
        b"$15\r\n1763900000000-1\r\n$5\r\n1763900000000-2\r\n+OK\r\n",
        b"$15\r\n1763900000000-1\r\n$15\r\n1763900000000-12\r\n-ERR x\r\n-ERR y\r\n",
    ],
)
def test_an_id_reply_whose_length_lies_is_read_as_the_general_parser_reads_it(
    stream: bytes,
) -> None:
    """The fast path must not count a reply whose declared length is not its id's."""
    assert _outcome(ReplyCounter(), stream) == _outcome(_GeneralParserOnly(), stream)


def test_a_bulk_length_that_is_not_a_number_is_a_resp_error() -> None:
    with pytest.raises(RespError, match="bad length"):
        ReplyCounter().feed(b"$1x\r\nab\r\n")


# --- the load clients' bookkeeping ------------------------------------------------------------


def test_send_times_give_the_oldest_requests_times_in_order() -> None:
    times = SendTimes()
    times.add(1.0, 3)
    times.add(2.0, 2)
    assert times.take(4) == [1.0, 1.0, 1.0, 2.0]
    assert times.outstanding == 1
    times.add(3.0, 1)
    assert times.take(2) == [2.0, 3.0]
    with pytest.raises(RuntimeError, match="1 replies for 0 requests in flight"):
        times.take(1)


def test_the_window_counts_a_chunk_only_inside_its_measured_span() -> None:
    window = Window(LoadConfig(warmup_s=10.0, duration_s=5.0))
    window.record(window.start - 1.0, [0.0, 0.0])  # still warming up
    window.record(window.start + 1.0, [window.start, window.start + 0.5])
    window.record(window.end, [window.start])  # after the end
    assert window.ops == 2
    assert window.latencies == [1.0, 0.5]
