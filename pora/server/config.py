"""How the network workers listen and what they bound: `ServerConfig`.

Its own module so that every part of a connection (reader, executor, writer) can
be built with it without knowing the `Server` that holds it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from netio import frames as f


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How the network workers listen and what they bound. Defaults suit one node
    on a developer machine; `pora serve` maps its flags and config file onto these.

    Memory the network layer can be made to hold, at most: per connection, one
    receive buffer (`frame_bytes_max + receive_bytes_max`) plus the adds and other
    responses in flight (`inflight_bytes_per_connection_max`, overshot by at most
    one read); times `connections_max`; plus read responses, at most
    `read_bytes_node_max` over all connections (or one response, if larger). A
    connection that begins a frame and stalls is closed after `idle_timeout_s`.
    """

    host: str = "127.0.0.1"
    port: int = 3181
    connections_max: int = 1024
    #: requests read from one connection and not yet answered
    inflight_per_connection_max: int = 4096
    #: payload bytes of those requests (a few huge entries count as much as many small)
    inflight_bytes_per_connection_max: int = 64 * 1024 * 1024
    #: requests in the node from all connections; past it new ones get OVERLOADED
    inflight_node_max: int = 65_536
    #: bytes of read responses (READ_ENTRY, READ_RANGE, LIST_LEDGERS) one connection
    #: may hold: a read reserves the most its response can take before it reads, and
    #: holds the response's bytes until its socket took them. Past it the connection's reads
    #: wait and its socket is not read (TCP pushes back on a peer that does not read
    #: its responses); a single response larger than this is still served, alone
    read_bytes_per_connection_max: int = 16 * 1024 * 1024
    #: the same over all connections: past it new reads wait
    read_bytes_node_max: int = 256 * 1024 * 1024
    frame_bytes_max: int = f.FRAME_BYTES_MAX_DEFAULT
    #: bytes asked of a socket at a time, into one buffer the server's plain-TCP
    #: connections share (TLS ones read through the ssl module): an ADD_RUN of
    #: 64 x 1 KiB takes one read
    receive_bytes_max: int = 256 * 1024
    #: a connection with nothing in flight and no bytes for this long is closed
    idle_timeout_s: float = 600.0
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "connections_max",
            "inflight_per_connection_max",
            "inflight_bytes_per_connection_max",
            "inflight_node_max",
            "read_bytes_per_connection_max",
            "read_bytes_node_max",
            "receive_bytes_max",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerConfig.{name} must be at least 1")
        if not self.idle_timeout_s > 0:
            raise ValueError("ServerConfig.idle_timeout_s must be positive")
        if self.frame_bytes_max < 64:
            raise ValueError("ServerConfig.frame_bytes_max must be at least 64")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file, or neither")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context, or None when TLS is off."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(
                f"cannot load the TLS certificate {self.tls_cert_file} and key "
                f"{self.tls_key_file}: {error}; check the paths (PEM files) and that the "
                "key belongs to the certificate"
            ) from error
        return context
