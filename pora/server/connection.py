"""One client connection: a reader, an executor and a writer, and what they share.

A `Connection` builds the three parts (`reader.py`, `executor.py`, `writer.py`),
each with what it needs, and runs them: the reader in the connection's own task,
the writer as a task beside it, requests other than adds as tasks of the same
nursery (the executor is built once that nursery is open). It owns the
connection's lifetime: closing it when idle or stalled, stopping it at shutdown,
and giving back what it held when it ends.

What the parts share is made here and handed to each (in_flight.py): the
`InFlight` count of requests and bytes, and the `ReadBytes` of read responses;
from the server it takes the node, the config, the counters, the node-wide read
budget and the shared receive buffer, never the server itself.
"""

from __future__ import annotations

import logging

import trio

from netio.budget import Budget
from netio.codec import RequestDecoder, encode_error
from netio.errors import ProtocolError
from pora.node.node import Node
from pora.server.config import ServerConfig
from pora.server.counters import ServerCounters
from pora.server.executor import LongPolls, RequestExecutor
from pora.server.in_flight import InFlight, ReadBytes
from pora.server.reader import RequestReader
from pora.server.writer import ResponseWriter

_log = logging.getLogger("pora.server")


class Connection:
    """One client connection: its reader (this task), executor and writer."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        node: Node,
        config: ServerConfig,
        counters: ServerCounters,
        node_read_budget: Budget,
        receive_buffer: bytearray,
    ) -> None:
        self.stream = stream
        self.node = node
        self.config = config
        self.counters = counters
        self.decoder = RequestDecoder(config.frame_bytes_max, config.receive_bytes_max)
        self.in_flight = in_flight = InFlight()
        #: bytes of read responses this connection holds (see ServerConfig)
        self.read_budget = Budget(
            config.read_bytes_per_connection_max, "read-response bytes of a connection", trio.Event
        )
        self.read_bytes = ReadBytes(self.read_budget, node_read_budget, in_flight)
        self.long_polls = LongPolls()
        self.writer = ResponseWriter(
            stream, self.decoder, counters=counters, in_flight=in_flight, read_bytes=self.read_bytes
        )
        self.reader = RequestReader(
            stream,
            self.decoder,
            config=config,
            counters=counters,
            in_flight=in_flight,
            read_budget=self.read_budget,
            receive_buffer=receive_buffer,
        )
        #: the connection's nursery's scope, cancelled to end it at once
        self.scope = trio.CancelScope()

    def close_if_idle(self, now: float) -> None:
        """Called by the sweeper: close a connection with nothing in flight that sent
        no byte for the idle timeout (even in the middle of a frame: a peer that
        starts a frame and stalls must not hold its buffer), or one that has not read
        its responses for that long."""
        idle_s = self.config.idle_timeout_s
        sending_since = self.writer.sending_since
        if sending_since is not None and now - sending_since >= idle_s:
            _log.info("closing a connection that has not read its responses for %.0f s", idle_s)
            self.scope.cancel()
        elif self.in_flight.count == 0 and now - self.reader.last_received >= idle_s:
            _log.info("closing a connection idle for %.0f s", idle_s)
            self.reader.scope.cancel()

    def stop_reading(self) -> None:
        """Shutdown: read no more requests, and end long polls now so the drain is quick."""
        self.reader.scope.cancel()
        self.long_polls.stop()

    async def run(self) -> None:
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    executor = RequestExecutor(
                        self.node,
                        self.config,
                        self.counters,
                        in_flight=self.in_flight,
                        read_bytes=self.read_bytes,
                        long_polls=self.long_polls,
                        writer=self.writer,
                        decoder=self.decoder,
                        nursery=nursery,
                    )
                    nursery.start_soon(self.writer.run, self.scope)
                    await self._read(executor)
        finally:
            self.writer.release_held()

    async def _read(self, executor: RequestExecutor) -> None:
        try:
            await self.reader.run(executor.dispatch)
        except ProtocolError as error:
            self.counters.protocol_errors += 1
            _log.info("closing a connection that sent a bad frame: %s", error)
            if error.request_id is not None:
                self.writer.queue(
                    encode_error(
                        error.request_id,
                        error.opcode,
                        error.status,
                        str(error),
                        version=self.writer.version,
                    ),
                    0,
                )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.scope.cancel()  # nobody to answer
        finally:
            self.in_flight.reading = False
            self.writer.wake()
