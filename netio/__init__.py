"""The wire protocol of a Pora node, as a pure sans-io codec (no sockets, no clocks).

`docs/protocol.md` is the grammar; `netio.frames` holds its constants, `netio.messages`
the decoded messages, `netio.codec` the encoders and the bounded decoders (requests in
`netio.request_codec`, responses in `netio.response_codec`, what both share in
`netio.framing`), `netio.status` the status codes' error types, and
`netio.security` the master-key derivation. The server (`pora.server`) and the client
(`pora.client.node_client`) drive this codec over trio and anyio streams.

`netio.budget` is the first-come-first-served budget both ends bound what they hold
in flight with; it waits on the caller's own event type, and so imports no event loop.
"""

from netio.codec import RequestDecoder, ResponseDecoder
from netio.errors import ConnectionLost, NodeOverloaded, ProtocolError, RemoteError, RequestTimeout
from netio.frames import Flag, Opcode, Status
from netio.security import master_key_from_password

__all__ = [
    "ConnectionLost",
    "Flag",
    "NodeOverloaded",
    "Opcode",
    "ProtocolError",
    "RemoteError",
    "RequestDecoder",
    "RequestTimeout",
    "ResponseDecoder",
    "Status",
    "master_key_from_password",
]
