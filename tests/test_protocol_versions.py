"""Versions 2 and 3 on one node: a connection speaks the version of its first frame."""

from __future__ import annotations

import pytest

from netio import codec
from netio import frames as f
from netio.errors import ProtocolError
from netio.messages import Delete, ErrorResponse, Info, Refused


def _as_version(frame: bytes, version: int) -> bytes:
    return frame[:4] + bytes([version]) + frame[5:]


def test_a_connection_keeps_the_version_of_its_first_frame() -> None:
    decoder = codec.RequestDecoder()
    decoder.receive_data(_as_version(codec.encode_request(Info(1)), 2))
    assert decoder.next_requests(10) == [Info(1)]
    assert decoder.version == 2
    decoder.receive_data(codec.encode_request(Info(2)))  # version 3 on a version-2 stream
    with pytest.raises(ProtocolError, match="began with version 2; one connection speaks one"):
        decoder.next_requests(10)


def test_a_version_2_delete_is_refused_and_the_stream_goes_on() -> None:
    decoder = codec.RequestDecoder()
    old_delete = f.HEADER.pack(f.LENGTH_MIN + 8, 2, f.Opcode.DELETE, 0, 0, 5) + (
        (9).to_bytes(8, "big")
    )
    decoder.receive_data(old_delete + _as_version(codec.encode_request(Info(6)), 2))
    refused, info = decoder.next_requests(10)
    assert isinstance(refused, Refused)
    assert (refused.request_id, refused.status) == (5, f.Status.BAD_REQUEST)
    assert "DELETE of ledger 9 in protocol version 2 carries no master key" in refused.message
    assert info == Info(6)


def test_a_version_3_delete_round_trips_with_its_key() -> None:
    decoder = codec.RequestDecoder()
    decoder.receive_data(codec.encode_request(Delete(3, 4, b"key")))
    assert decoder.next_requests(10) == [Delete(3, 4, b"key")]


def test_corruption_reaches_a_version_2_peer_as_an_internal_error() -> None:
    for version, status in ((3, f.Status.CORRUPT), (2, f.Status.INTERNAL_ERROR)):
        frame = codec.encode_error(1, f.Opcode.READ_ENTRY, f.Status.CORRUPT, "bad", version=version)
        decoder = codec.ResponseDecoder(version=version)
        decoder.receive_data(frame)
        [response] = decoder.next_responses()
        assert isinstance(response, ErrorResponse)
        assert response.status == status and response.message == "bad"
