"""One client connection: a reader, an executor and a writer, and what they share.

A `Connection` composes the three halves (`reader.py`, `executor.py`,
`writer.py`) and runs them: the reader in the connection's own task, the writer
as a task beside it, requests other than adds as tasks of the same nursery. It
owns the connection's lifetime: closing it when idle or stalled, stopping it at
shutdown, and giving back what it held when it ends.

`InFlight` is the one piece the halves share: how many requests and bytes are in
flight on the connection, whether the reader still reads, and the event the
reader waits on for room. The reader adds what it hands on; the executor adds
the bytes of what it admits; the writer takes away what it sent; each signals
the reader with `open()`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from netio.codec import RequestDecoder, encode_error
from netio.errors import ProtocolError
from pora.server.executor import RequestExecutor
from pora.server.reader import RequestReader
from pora.server.writer import ResponseWriter

if TYPE_CHECKING:
    from netio.budget import Budget
    from pora.server.server import Server

_log = logging.getLogger("pora.server")


class InFlight:
    """Requests and bytes in flight on one connection, and the reader's wake-up."""

    __slots__ = ("bytes", "count", "reading", "space")

    def __init__(self) -> None:
        #: requests read and not yet answered (their responses not yet sent)
        self.count = 0
        #: payload bytes of those requests, and bytes of responses waiting to be sent
        self.bytes = 0
        #: the reader still reads: the writer must not end the connection yet
        self.reading = True
        #: set when room may have opened (the reader waits on it when full)
        self.space = trio.Event()

    def open(self) -> None:
        if not self.space.is_set():
            self.space.set()


class Connection:
    """One client connection: its reader (this task), executor and writer."""

    def __init__(self, server: Server, stream: trio.abc.Stream) -> None:
        self.server = server
        self.stream = stream
        config = server.config
        self.decoder = RequestDecoder(config.frame_bytes_max, config.receive_bytes_max)
        self.in_flight = in_flight = InFlight()
        self.writer = ResponseWriter(server, stream, in_flight, self.decoder)
        self.executor = RequestExecutor(server, in_flight, self.writer, self.decoder)
        self.writer.executor = self.executor
        self.reader = RequestReader(server, stream, in_flight, self.executor, self.decoder)
        #: the connection's nursery's scope, cancelled to end it at once
        self.scope = trio.CancelScope()

    @property
    def read_budget(self) -> Budget:
        return self.executor.read_budget

    def close_if_idle(self, now: float) -> None:
        """Called by the sweeper: close a connection with nothing in flight that sent
        no byte for the idle timeout (even in the middle of a frame: a peer that
        starts a frame and stalls must not hold its buffer), or one that has not read
        its responses for that long."""
        idle_s = self.server.config.idle_timeout_s
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
        self.executor.stop()

    async def run(self) -> None:
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    self.executor.nursery = nursery
                    nursery.start_soon(self.writer.run, self.scope)
                    await self._read()
        finally:
            self.writer.release_held()

    async def _read(self) -> None:
        try:
            await self.reader.run()
        except ProtocolError as error:
            self.server.protocol_errors += 1
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
