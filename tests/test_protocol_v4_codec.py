"""Version 4's bodies: round trips, the version-dependent layouts, and refusals."""

from __future__ import annotations

import struct

import pytest

from netio import codec
from netio import frames as f
from netio.errors import ProtocolError
from netio.messages import (
    AddBatch,
    AddBatchResponse,
    InfoResponse,
    LacResponse,
    ReadLac,
    ReadRange,
    ReadRangeResponse,
    Refused,
    RequestMessage,
    ResponseMessage,
    WriteLac,
    WriteLacResponse,
)


def _decode_requests(frame: bytes) -> list[object]:
    decoder = codec.RequestDecoder()
    decoder.receive_data(frame)
    return list(decoder.next_requests(10))


def _decode_responses(frame: bytes, version: int = 4) -> list[ResponseMessage]:
    decoder = codec.ResponseDecoder(version=version)
    decoder.receive_data(frame)
    return decoder.next_responses()


@pytest.mark.parametrize(
    "message",
    [
        AddBatch(1, 7, 3, b"key", [0, 3, 6, 9], [b"a", b"", b"ccc", b"d" * 300]),
        AddBatch(2, 7, -1, b"", [5], [b"x"], recovery=True),
        WriteLac(3, 7, 42, b"key"),
        ReadLac(4, 7, 10, 5000, True, b"key"),
        ReadLac(5, 7),
        ReadLac(8, 7, 10, 5000, with_entry=True),
        ReadLac(9, 7, 10, 0, True, b"key", with_entry=True),
        ReadRange(6, 7, 0, 99, 10, 1000, True, b"key"),
        ReadRange(7, 7, 0, 99, 10, 1000),
    ],
)
def test_version_4_requests_round_trip(message: RequestMessage) -> None:
    assert _decode_requests(codec.encode_request(message)) == [message]


@pytest.mark.parametrize(
    "message",
    [
        AddBatchResponse(1, 7, 0, 4, [(3, f.Status.ENTRY_CONFLICT, "conflict")]),
        AddBatchResponse(2, 7, 5, 1, []),
        WriteLacResponse(3, 7, 42),
        LacResponse(4, 7, 10, 12),
        LacResponse(9, 7, 11, 12, b"entry eleven"),
        LacResponse(10, 7, 11, 12, b""),
        ReadRangeResponse(5, 7, 3, [(0, b"a"), (3, b"b")], True),
        ReadRangeResponse(6, 7, 3, [], False),
        InfoResponse(7, 4, None, 1 << 20, 1 << 16, 3, "0.1.0", "abc123"),
        InfoResponse(8, 4, "disk full", 1 << 20, 1 << 16, 3, "0.1.0", "abc123"),
    ],
)
def test_version_4_responses_round_trip(message: ResponseMessage) -> None:
    assert _decode_responses(codec.encode_response(message, 4)) == [message]


def test_version_3_bodies_are_unchanged() -> None:
    """READ_LAC, READ_RANGE and INFO keep their version-3 layouts on a version-3
    connection: the new fields are neither sent nor expected."""
    lac = codec.encode_request(ReadLac(1, 7), 3)
    assert lac[4] == 3 and len(lac) == f.HEADER_BYTES + 8
    assert _decode_requests(lac) == [ReadLac(1, 7)]
    rng = codec.encode_request(ReadRange(2, 7, 0, 5, 10, 100), 3)
    assert len(rng) == f.HEADER_BYTES + f.READ_RANGE_REQUEST.size
    assert _decode_requests(rng) == [ReadRange(2, 7, 0, 5, 10, 100)]
    answer = codec.encode_response(LacResponse(1, 7, 10, 12), 3)
    assert _decode_responses(answer, 3) == [LacResponse(1, 7, 10, -1)]
    ranged = codec.encode_response(ReadRangeResponse(2, 7, 3, [(0, b"a")], True), 3)
    assert ranged[6] == f.Flag.RESPONSE  # no MORE flag for a version-3 peer
    info = codec.encode_response(InfoResponse(3, 4, None, 1, 1, 0, "v", "inst"), 3)
    [decoded] = _decode_responses(info, 3)
    assert isinstance(decoded, InfoResponse) and decoded.instance_id == ""
    with pytest.raises(TypeError, match="from protocol version 4"):
        codec.encode_request(WriteLac(1, 7, 3), 3)
    with pytest.raises(ValueError, match="fencing ReadLac exists from protocol version 4"):
        codec.encode_request(ReadLac(1, 7, fence=True, master_key=b"k"), 3)


def test_a_lac_answer_carries_its_entry_under_the_entry_flag() -> None:
    with_entry = codec.encode_response(LacResponse(1, 7, 11, 12, b"abc"), 4)
    assert with_entry[6] == f.Flag.RESPONSE | f.Flag.ENTRY
    assert len(with_entry) == f.HEADER_BYTES + f.READ_LAC_RESPONSE_V4.size + 3
    without = codec.encode_response(LacResponse(1, 7, 11, 12), 4)
    assert without[6] == f.Flag.RESPONSE
    # bytes past the fields without the flag: the frame is not trusted
    stray = bytearray(without + b"x")
    stray[0:4] = (len(stray) - 4).to_bytes(4, "big")
    with pytest.raises(ProtocolError, match="without the ENTRY flag"):
        _decode_responses(bytes(stray))
    with pytest.raises(ValueError, match="ReadLac with its entry exists from protocol version 4"):
        codec.encode_request(ReadLac(1, 7, with_entry=True), 3)


@pytest.mark.parametrize("opcode", [f.Opcode.ADD_BATCH, f.Opcode.WRITE_LAC])
def test_the_new_opcodes_are_unknown_to_a_version_3_connection(opcode: int) -> None:
    frame = f.HEADER.pack(f.LENGTH_MIN + 17, 3, opcode, 0, 0, 9) + bytes(17)
    decoder = codec.RequestDecoder()
    decoder.receive_data(frame)
    with pytest.raises(ProtocolError, match=f"unknown opcode {int(opcode)}"):
        decoder.next_requests(10)


def _batch_frame(rid: int, count: int, items: bytes, payload: bytes, key: bytes = b"") -> bytes:
    body = f.ADD_BATCH_REQUEST_FIXED.pack(7, -1, count, len(key)) + key + items + payload
    return f.HEADER.pack(f.LENGTH_MIN + len(body), 4, f.Opcode.ADD_BATCH, 0, 0, rid) + body


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (_batch_frame(9, 0, b"", b""), "ADD_BATCH of 0 entries; a batch carries 1 to 1024"),
        (_batch_frame(9, 1025, b"", b""), "ADD_BATCH of 1025 entries"),
        (_batch_frame(9, 2, struct.pack(">qI", 0, 1), b"a"), "ids run 11 bytes past"),
        (
            _batch_frame(9, 2, struct.pack(">qIqI", 0, 1, 1, 1), b"abc"),
            "payload sizes add up to 2 bytes, but 3 bytes",
        ),
    ],
)
def test_a_malformed_batch_is_a_bad_request(frame: bytes, reason: str) -> None:
    """A count out of bounds or sizes that do not fill the frame break the framing:
    BAD_REQUEST, and the connection is closed."""
    decoder = codec.RequestDecoder()
    decoder.receive_data(frame)
    with pytest.raises(ProtocolError, match=reason) as caught:
        decoder.next_requests(10)
    assert caught.value.status == f.Status.BAD_REQUEST and caught.value.request_id == 9


@pytest.mark.parametrize("ids", [(3, 3), (5, 4), (0, 2, 1)])
def test_batch_ids_that_do_not_strictly_increase_are_an_invalid_argument(
    ids: tuple[int, ...],
) -> None:
    """Well framed, a bad value: refused alone with INVALID_ARGUMENT (as a negative
    id is), and the stream goes on."""
    items = b"".join(struct.pack(">qI", entry_id, 1) for entry_id in ids)
    frame = _batch_frame(9, len(ids), items, b"x" * len(ids))
    after = codec.encode_request(WriteLac(10, 7, 1))
    refused, write_lac = _decode_requests(frame + after)
    assert isinstance(refused, Refused)
    assert refused.status == f.Status.INVALID_ARGUMENT and refused.request_id == 9
    assert "strictly increase" in refused.message
    assert write_lac == WriteLac(10, 7, 1)


def test_the_batch_encoder_refuses_what_no_node_takes() -> None:
    with pytest.raises(ValueError, match="1 to 1024 entries"):
        codec.encode_request(AddBatch(1, 7, -1, b"", [], []))
    with pytest.raises(ValueError, match="one id each"):
        codec.encode_request(AddBatch(1, 7, -1, b"", [1, 2], [b"a"]))


def test_a_read_lac_key_must_end_the_frame() -> None:
    frame = codec.encode_request(ReadLac(4, 7, 10, 0, True, b"key"))
    bad = frame[:3] + bytes([frame[3] + 1]) + frame[4:] + b"z"
    decoder = codec.RequestDecoder()
    decoder.receive_data(bad)
    with pytest.raises(ProtocolError, match="READ_LAC master key does not end the frame"):
        decoder.next_requests(10)
