"""The metrics and health endpoint, scraped over a real socket from a real node."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import trio
from serve_helpers import http_get, samples

import pora
from pora.bench.resp import ReplyCounter, encode_command
from pora.server.logs import JsonFormatter, LogfmtFormatter
from pora.server.metrics import NodeMetrics, serve_metrics


async def test_scrape_moves_with_adds_and_health_follows_read_only(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node, trio.open_nursery() as nursery:
        metrics = NodeMetrics(node, node.data_dir.journal_dir)
        node.add_commit_listener(metrics.commits.on_commit)
        _, port = await nursery.start(serve_metrics, metrics, "127.0.0.1", 0)

        status, before_text = await http_get(port, "/metrics")
        assert status == 200
        before = samples(before_text)
        assert before["pora_journal_records_total"] == 0
        assert before["pora_read_only"] == 0

        for entry_id in range(20):
            await node.add_entry(7, entry_id, b"x" * 1024)
        _, after_text = await http_get(port, "/metrics")
        after = samples(after_text)
        # at least one record per add (a ledger's first add may journal its key too)
        assert 20 <= after["pora_journal_records_total"] <= 21
        assert after["pora_journal_bytes_total"] > 20 * 1024
        assert after["pora_group_commit_records_count"] >= 1
        assert after["pora_group_commit_records_sum"] == after["pora_journal_records_total"]
        assert after["pora_journal_fsync_seconds_count"] == after["pora_journal_commits_total"]
        assert after["pora_ledgers"] == 1
        assert after["pora_open_ledgers"] == 1
        assert after["pora_ledger_payload_bytes"] == 20 * 1024
        # the entry logs grow as the ledger flushes, in the background
        assert after["pora_entry_log_bytes"] >= 0
        assert after["pora_memtable_bytes"] >= 20 * 1024
        assert after["pora_journal_segments"] >= 1
        # 20 kB is far below a quarter of a segment: no spare is made for it
        assert after["pora_journal_spare_segments_made_total"] == 0
        assert after["pora_journal_spare_segments_taken_total"] == 0

        assert await http_get(port, "/health") == (200, "ok\n")
        node.set_read_only("disk nearly full: test")
        status, body = await http_get(port, "/health")
        assert status == 503
        assert "read-only: disk nearly full: test" in body
        assert samples((await http_get(port, "/metrics"))[1])["pora_read_only"] == 1
        node.set_read_only(None)
        assert await http_get(port, "/health") == (200, "ok\n")

        assert (await http_get(port, "/nope"))[0] == 404
        nursery.cancel_scope.cancel()


async def test_bad_requests_get_400_and_the_endpoint_keeps_serving(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node, trio.open_nursery() as nursery:
        metrics = NodeMetrics(node, node.data_dir.journal_dir)
        _, port = await nursery.start(serve_metrics, metrics, "127.0.0.1", 0)
        for garbage in (b"\x00\xff garbage\r\n\r\n", b"GET /metrics\r\n\r\n", b"A" * 20000):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                await stream.send_all(garbage)
                reply = await stream.receive_some(65536)
            assert reply.startswith(b"HTTP/1.1 400")
        assert (await http_get(port, "/health"))[0] == 200
        nursery.cancel_scope.cancel()


def test_log_lines_are_json_or_logfmt() -> None:
    record = logging.LogRecord("pora.serve", logging.INFO, __file__, 1, "serving %s", ("x",), None)
    record.fields = {"listen": "127.0.0.1:1", "msg": "clash"}
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "info"
    assert line["msg"] == "serving x"
    assert line["listen"] == "127.0.0.1:1"
    assert line["field_msg"] == "clash"
    text = LogfmtFormatter().format(record)
    assert 'msg="serving x"' in text
    assert "listen=127.0.0.1:1" in text


def test_resp_replies_are_counted_across_chunks() -> None:
    assert encode_command([b"XADD", b"k"]) == b"*2\r\n$4\r\nXADD\r\n$1\r\nk\r\n"
    counter = ReplyCounter()
    stream = b"$15\r\n1700000000000-0\r\n+OK\r\n:5\r\n-ERR oops\r\n*2\r\n$1\r\na\r\n$-1\r\n"
    total = sum(counter.feed(stream[i : i + 3]) for i in range(0, len(stream), 3))
    assert total == 5
    assert counter.errors == ["ERR oops"]
