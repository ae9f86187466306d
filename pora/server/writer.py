"""The writing half of a connection: responses from the node back to the socket.

A `ResponseWriter` owns what waits to be sent: the finished adds and runs whose
responses are not encoded yet (`adds_done`, `runs_done`), the encoded frames
(`outgoing`, with how many requests and bytes they answer), the read-response
bytes those frames hold, and the socket's send side (`raw_fd`, `sending_since`,
the writer task's wake-up). It is built with what it touches: the connection's
`InFlight` (to retire what it sent), the connection's `ReadBytes` (to give back
the bytes of read responses once sent) and the server's counters (responses by
status, bytes sent).

Two ways out, both deliberate (the hot path of adds):
- `_respond`, called by the ledger worker that completed an add, encodes every
  finished response and writes it with one non-blocking `os.write` when the
  writer task is not inside a send: no wake-up of another task, no turn of the
  event loop per response. What the socket does not take goes to the writer task,
  first in line.
- the writer task (`run`), for TLS, for a full socket, and for everything queued
  while a send is under way: it packs every finished response into one buffer and
  sends it with one `send_all`.
"""

from __future__ import annotations

import os

import trio

from journal.request import Request
from netio.codec import (
    RequestDecoder,
    encode_add_run_response,
    encode_add_run_responses,
    encode_error,
)
from netio.frames import PROTOCOL_VERSION, Opcode, status_byte
from netio.status import status_of
from pora import tracing
from pora.server.counters import ServerCounters
from pora.server.in_flight import InFlight, ReadBytes


def error_frame(request_id: int, opcode: int, error: BaseException, version: int) -> bytes:
    """The error response that tells the client which engine error failed its request."""
    return encode_error(
        request_id,
        opcode,
        status_of(error),
        str(error) or type(error).__name__,
        ledger_id=getattr(error, "ledger_id", -1),
        entry_id=getattr(error, "entry_id", -1),
        version=version,
    )


class ResponseWriter:
    """The responses of one connection, from completion to the socket."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        decoder: RequestDecoder,
        *,
        counters: ServerCounters,
        in_flight: InFlight,
        read_bytes: ReadBytes,
    ) -> None:
        self.stream = stream
        #: the reader's decoder, read here for the protocol version only
        self.decoder = decoder
        self.counters = counters
        self.in_flight = in_flight
        #: the connection's read-response bytes, given back as their frames are sent
        self.read_bytes = read_bytes
        #: responses ready to send, and how many requests they answer
        self.outgoing: list[bytes | bytearray] = []
        self.outgoing_count = 0
        #: bytes of queued frames other than add responses (counted in flight)
        self.outgoing_bytes = 0
        #: read-response bytes held by the frames in `outgoing`, and by the send under way
        self.outgoing_read_bytes = 0
        self.sending_read_bytes = 0
        #: adds the node completed, waiting for their responses to be encoded
        self.adds_done: list[Request] = []
        #: runs (ADD_RUN frames) the node completed, likewise; their `tag` is the
        #: frame's request id
        self.runs_done: list[Request] = []
        self.wakeup = trio.Event()
        #: since when a send has been blocked (None: not sending); the server's idle
        #: sweeper reads it
        self.sending_since: float | None = None
        #: the socket's fd, for sending a response straight from the task that
        #: completed it (`_respond`); -1 for TLS, and once the connection has ended
        #: (the fd may then be another connection's)
        self.raw_fd = -1
        #: the tracer of when responses leave (`pora.tracing`), None when tracing is off
        self.trace = tracing.current()
        if type(stream) is trio.SocketStream:
            self.raw_fd = stream.socket.fileno()

    @property
    def version(self) -> int:
        """The protocol version of the connection's requests, and so of its answers."""
        return self.decoder.version or PROTOCOL_VERSION

    # --- completions (called by ledger workers) ----------------------------------------------

    def add_done(self, request: Request) -> None:
        """An add the node completed (called in a ledger worker: kept tiny, the
        encoding waits for `_respond` or the writer task)."""
        self.adds_done.append(request)
        self._respond()

    def run_done(self, request: Request) -> None:
        """As `add_done`, for a run that answers one ADD_RUN frame."""
        self.runs_done.append(request)
        self._respond()

    def _respond(self) -> None:
        """Answer what is done: right now when the socket is free, else by the writer.

        Sending from here (a ledger worker, after the group's sync) rather than
        waking the writer task saves a turn of the event loop per response, a tenth
        of a millisecond or more under load. Safe because it runs only while the
        writer is not inside `send_all` and everything queued before goes first.
        """
        if self.raw_fd >= 0 and self.sending_since is None:
            self._send_directly()
        elif not self.wakeup.is_set():
            self.wakeup.set()

    def _send_directly(self) -> None:
        """Encode and send every response ready, with one non-blocking write; what
        the socket does not take now goes to the writer task, first in line."""
        if self.adds_done:
            self._encode_adds_done()
        if self.runs_done:
            self._encode_runs_done()
        frames = self.outgoing
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        try:
            sent = os.write(self.raw_fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.wake()  # its send_all meets the error and ends the connection
            return
        counters = self.counters
        counters.bytes_sent += sent
        in_flight = self.in_flight
        in_flight.count -= self.outgoing_count
        self.outgoing_count = 0
        if sent == len(data):
            self.outgoing = []
            in_flight.bytes -= self.outgoing_bytes
            self.outgoing_bytes = 0
            if self.outgoing_read_bytes:
                self.read_bytes.release(self.outgoing_read_bytes)
                self.outgoing_read_bytes = 0
            if not in_flight.reading:
                self.wake()  # it ends the connection once nothing is in flight
        else:
            counters.sends_backed_up += 1
            rest = bytes(memoryview(data)[sent:])
            self.outgoing = [rest]
            in_flight.bytes -= self.outgoing_bytes - len(rest)
            self.outgoing_bytes = len(rest)
            self.wake()
        in_flight.open()

    # --- queueing ----------------------------------------------------------------------------

    def queue(self, frame: bytes, responses: int, read_bytes: int = 0) -> None:
        """Queue one response frame; `responses` is how many requests in flight it
        answers (0 for the answer to a frame that never became a request), and
        `read_bytes` the read-response bytes it holds until it is sent."""
        self.outgoing.append(frame)
        self.outgoing_read_bytes += read_bytes
        self.outgoing_count += responses
        # responses waiting to be sent count as bytes in flight until they are
        self.outgoing_bytes += len(frame)
        self.in_flight.bytes += len(frame)
        self.counters.responses_by_status[status_byte(frame)] += 1
        self.wake()

    def wake(self) -> None:
        if not self.wakeup.is_set():
            self.wakeup.set()

    def release_held(self) -> None:
        """The connection ended: responses never sent give their read bytes back
        (reads under way did, when they were cancelled)."""
        self.raw_fd = -1
        held = self.outgoing_read_bytes + self.sending_read_bytes
        self.outgoing_read_bytes = self.sending_read_bytes = 0
        if held:
            self.read_bytes.release(held)

    # --- encoding ----------------------------------------------------------------------------

    def _encode_adds_done(self) -> None:
        done = self.adds_done
        self.adds_done = []
        if self.trace is not None:
            self.trace.responses_encoded(done)
        statuses = self.counters.responses_by_status
        answered = sum([len(request.tags) for request in done])
        ok = done
        failed = [r for r in done if r.error is not None or r.entry_errors is not None]
        if failed:  # rare: answer each failed add with its own error frame
            ok = [r for r in done if r.error is None and r.entry_errors is None]
            for request in failed:
                self._encode_failed_run(request)
        if ok:
            self.outgoing.append(
                encode_add_run_responses(
                    [(r.tags, r.ledger_id, r.entry_id) for r in ok], self.version
                )
            )
            statuses[0] += answered if not failed else sum([len(r.tags) for r in ok])
        self.outgoing_count += answered
        self.in_flight.bytes -= sum([request.payload_bytes for request in done])

    def _encode_runs_done(self) -> None:
        """One response frame per finished ADD_RUN: OK (listing the entries that failed
        alone, if any), or the error that failed the whole run."""
        done = self.runs_done
        self.runs_done = []
        if self.trace is not None:
            self.trace.responses_encoded(done)
        statuses = self.counters.responses_by_status
        outgoing = self.outgoing
        version = self.version
        for run in done:
            if run.error is not None:
                frame = error_frame(run.tag, Opcode.ADD_RUN, run.error, version)
            elif run.entry_errors is None:
                frame = encode_add_run_response(
                    run.tag, run.ledger_id, run.entry_id, run.count, version=version
                )
            else:
                failures = [
                    (run.entry_id + index, int(status_of(error)), str(error))
                    for index, error in enumerate(run.entry_errors)
                    if error is not None
                ]
                frame = encode_add_run_response(
                    run.tag, run.ledger_id, run.entry_id, run.count, failures, version
                )
            outgoing.append(frame)
            statuses[status_byte(frame)] += 1
        self.outgoing_count += len(done)
        self.in_flight.bytes -= sum([run.payload_bytes for run in done])

    def _encode_failed_run(self, request: Request) -> None:
        statuses = self.counters.responses_by_status
        for index, tag in enumerate(request.tags):
            error = request.error_of(index)
            if error is None:
                frame = bytes(
                    encode_add_run_responses(
                        [((tag,), request.ledger_id, request.entry_id + index)], self.version
                    )
                )
            else:
                frame = error_frame(tag, Opcode.ADD_ENTRY, error, self.version)
            self.outgoing.append(frame)
            statuses[status_byte(frame)] += 1

    # --- the writer task ---------------------------------------------------------------------

    async def run(self, cancel_connection: trio.CancelScope) -> None:
        """Send what is queued until the reader stopped and nothing is in flight;
        cancel the connection (`cancel_connection`) if the peer is gone."""
        stream = self.stream
        counters = self.counters
        in_flight = self.in_flight
        while True:
            if self.adds_done:
                self._encode_adds_done()
            if self.runs_done:
                self._encode_runs_done()
            if not self.outgoing:
                if not in_flight.reading and in_flight.count == 0:
                    return
                self.wakeup = trio.Event()
                await self.wakeup.wait()
                continue
            frames = self.outgoing
            count = self.outgoing_count
            sent_bytes = self.outgoing_bytes
            sending_read_bytes = self.sending_read_bytes = self.outgoing_read_bytes
            self.outgoing_read_bytes = 0
            self.outgoing_bytes = 0
            self.outgoing = []
            self.outgoing_count = 0
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            self.sending_since = trio.current_time()
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                cancel_connection.cancel()  # the peer is gone: nobody to answer
                return
            self.sending_since = None
            counters.bytes_sent += len(data)
            in_flight.count -= count
            in_flight.bytes -= sent_bytes
            if sending_read_bytes:
                self.sending_read_bytes = 0
                self.read_bytes.release(sending_read_bytes)
            in_flight.open()
