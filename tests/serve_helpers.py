"""Helpers shared by the tests of `pora serve`: a raw HTTP GET and a scrape parser."""

from __future__ import annotations

import trio
from prometheus_client.parser import text_string_to_metric_families


async def http_get(port: int, target: str) -> tuple[int, str]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        response = bytearray()
        while chunk := await stream.receive_some(65536):
            response += chunk
    head, _, body = bytes(response).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body.decode()


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample of a scrape."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values
