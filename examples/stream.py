"""Write a stream on the local cluster while a subscriber follows it.

    bash scripts/cluster.sh                  # one terminal: 3 nodes
    .venv/bin/python examples/stream.py      # another, from the same folder

Pass the metadata URL `pora cluster` printed to use another cluster:
`.venv/bin/python examples/stream.py zk://127.0.0.1:2181/pora`. Run it again and the
new writer takes the stream over, in a new segment.
"""

from __future__ import annotations

import asyncio
import sys

import pora


async def follow(stream: pora.Stream, start: pora.Position, count: int) -> None:
    """Print `count` entries from `start` on, as they are acknowledged."""
    async for position, payload in stream.subscribe(from_=start):
        print(f"subscriber got {position}: {payload.decode()}")
        count -= 1
        if count == 0:
            return


async def main(url: str) -> None:
    async with pora.connect(url) as client:
        try:
            stream = await client.create_stream("demo-events", segment_bytes_max=64 << 10)
        except pora.StreamExists:
            stream = await client.open_stream("demo-events")
        lines = [b"hello", b"streamed", b"world"]
        async with stream.open_writer() as writer:  # fences any earlier writer
            first = await writer.append(lines[0])  # returns once 2 of 3 nodes hold it
            print(f"appended at {first}")
            # a subscriber from there on follows the appends as they are acknowledged
            follower = asyncio.create_task(follow(stream, first, len(lines)))
            for line in lines[1:]:
                print(f"appended at {await writer.append(line)}")
        await follower


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:pora-cluster/meta.db"))
