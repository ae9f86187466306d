"""What the server counts over all its connections.

One `ServerCounters` belongs to the `Server`; it hands the same object to each
part of every connection, which bumps the counters of its own work: the reader
the bytes received, the executor the requests by opcode and the requests in the
node, the writer the responses by status and the bytes sent. Plain attributes,
not methods: they are bumped on the hot path of every add.
"""

from __future__ import annotations


class ServerCounters:
    """The server's counters; `Server.statistics` reads them."""

    __slots__ = (
        "bytes_received",
        "bytes_sent",
        "connections_accepted",
        "connections_refused",
        "inflight",
        "protocol_errors",
        "requests_by_opcode",
        "responses_by_status",
        "sends_backed_up",
    )

    def __init__(self) -> None:
        #: requests in the node from all connections (admitted and not completed);
        #: only the executors change it: they admit requests and see them complete
        self.inflight = 0
        self.connections_accepted = 0
        #: connections turned away because connections_max were open
        self.connections_refused = 0
        #: connections closed for sending bytes that are not the protocol
        self.protocol_errors = 0
        #: indexed by opcode and by status byte: a list is the cheapest to bump
        self.requests_by_opcode = [0] * 256
        self.responses_by_status = [0] * 256
        self.bytes_received = 0
        self.bytes_sent = 0
        #: responses sent straight from completion whose socket took only part
        self.sends_backed_up = 0
