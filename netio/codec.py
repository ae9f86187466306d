"""Encoders and bounded decoders of frames: bytes in, messages out; messages in, bytes out.

Pure code, no I/O (in the manner of h11): a server feeds what its socket gave to a
`RequestDecoder` and takes back every complete request; a client does the same with
a `ResponseDecoder`. The decoders hold at most one incomplete frame plus one received
chunk, and refuse a frame whose length prefix exceeds the configured maximum before
any of its body is buffered.

This module is the codec's one front: requests are in `netio.request_codec`,
responses in `netio.response_codec`, what both share (constants, the header, the
bounded buffer) in `netio.framing`, and the bulk encoders and decoders of a load
generator in `netio.bulk`.
"""

from netio.framing import RECEIVE_BYTES_DEFAULT
from netio.request_codec import RequestDecoder
from netio.request_encoding import (
    encode_add_batch,
    encode_add_entry,
    encode_add_run,
    encode_request,
)
from netio.response_codec import (
    ResponseDecoder,
    encode_add_run_response,
    encode_add_run_responses,
    encode_error,
    encode_response,
)

__all__ = [
    "RECEIVE_BYTES_DEFAULT",
    "RequestDecoder",
    "ResponseDecoder",
    "encode_add_batch",
    "encode_add_entry",
    "encode_add_run",
    "encode_add_run_response",
    "encode_add_run_responses",
    "encode_error",
    "encode_request",
    "encode_response",
]
