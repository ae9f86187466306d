"""The sans-io codec: what a peer relies on when it sends and parses frames."""

from __future__ import annotations

import contextlib
import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netio import codec
from netio import frames as f
from netio.errors import ProtocolError
from netio.messages import (
    AddEntry,
    AddEntryResponse,
    Close,
    CloseResponse,
    Delete,
    DeleteResponse,
    ErrorResponse,
    Fence,
    FenceResponse,
    Info,
    InfoResponse,
    LacResponse,
    LedgerSummary,
    ListLedgers,
    ListLedgersResponse,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadRange,
    ReadRangeResponse,
    RequestMessage,
    ResponseMessage,
)
from netio.security import master_key_from_password

ids = st.integers(min_value=0, max_value=2**64 - 1)
i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)
keys = st.binary(max_size=255)
payloads = st.binary(max_size=2000)

requests: st.SearchStrategy[RequestMessage] = st.one_of(
    st.builds(AddEntry, ids, i64, i64, i64, keys, payloads, st.booleans()),
    st.builds(ReadEntry, ids, i64, i64, u32, st.booleans(), keys),
    st.builds(ReadRange, ids, i64, i64, i64, u32, u32),
    st.builds(ReadLac, ids, i64),
    st.builds(Fence, ids, i64, keys),
    st.builds(
        Close,
        ids,
        i64,
        st.one_of(st.none(), st.integers(min_value=-1, max_value=2**63 - 1)),
        keys,
    ),
    st.builds(Delete, ids, i64),
    st.builds(ListLedgers, ids, i64, u32),
    st.builds(Info, ids),
)

summaries = st.builds(
    LedgerSummary,
    i64,
    st.sampled_from(["open", "closed", "fenced"]),
    i64,
    i64,
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
responses: st.SearchStrategy[ResponseMessage] = st.one_of(
    st.builds(AddEntryResponse, ids, i64, i64),
    st.builds(ReadEntryResponse, ids, i64, i64, i64, payloads),
    st.builds(
        ReadRangeResponse,
        ids,
        i64,
        i64,
        st.lists(st.tuples(i64, st.binary(max_size=100)), max_size=20),
    ),
    st.builds(LacResponse, ids, i64, i64),
    st.builds(FenceResponse, ids, i64, i64),
    st.builds(CloseResponse, ids, i64, i64),
    st.builds(DeleteResponse, ids, i64),
    st.builds(ListLedgersResponse, ids, st.lists(summaries, max_size=10), st.booleans()),
    st.builds(
        InfoResponse,
        ids,
        st.just(1),
        st.one_of(st.none(), st.text(max_size=50)),
        u32,
        u32,
        st.integers(0, 2**64 - 1),
        st.text(max_size=30).filter(lambda t: len(t.encode()) <= 255),
    ),
    st.builds(
        ErrorResponse,
        ids,
        st.sampled_from(list(f.Opcode)),
        st.sampled_from([s for s in f.Status if s != f.Status.OK]),
        i64,
        i64,
        st.text(max_size=200).filter(lambda t: len(t.encode()) <= f.ERROR_MESSAGE_BYTES_MAX),
    ),
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = []
    start = 0
    for point in [*points, len(data)]:
        pieces.append(data[start:point])
        start = point
    return pieces


@settings(max_examples=300, deadline=None)
@given(st.lists(requests, min_size=1, max_size=20), st.lists(st.integers(0, 10**6), max_size=8))
def test_requests_round_trip_however_the_stream_is_split(
    messages: list[RequestMessage], cuts: list[int]
) -> None:
    stream = b"".join(codec.encode_request(m) for m in messages)
    decoder = codec.RequestDecoder()
    decoded: list[RequestMessage] = []
    for piece in _split(stream, cuts):
        decoder.receive_data(piece)
        decoded.extend(decoder.next_requests(1000))
    assert decoded == messages
    assert decoder.buffered_bytes == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(responses, min_size=1, max_size=20), st.lists(st.integers(0, 10**6), max_size=8))
def test_responses_round_trip_however_the_stream_is_split(
    messages: list[ResponseMessage], cuts: list[int]
) -> None:
    stream = b"".join(codec.encode_response(m) for m in messages)
    decoder = codec.ResponseDecoder()
    decoded: list[ResponseMessage] = []
    for piece in _split(stream, cuts):
        decoder.receive_data(piece)
        decoded.extend(decoder.next_responses())
    assert decoded == messages


def test_batched_add_responses_decode_one_per_add() -> None:
    entries = [AddEntryResponse(0, 7, i) for i in range(1000)]
    data = codec.encode_add_responses(list(range(1000, 2000)), entries)
    decoder = codec.ResponseDecoder()
    decoder.receive_data(bytes(data))
    assert decoder.next_responses() == [AddEntryResponse(1000 + i, 7, i) for i in range(1000)]


def test_next_requests_takes_no_more_than_asked_and_keeps_the_rest() -> None:
    decoder = codec.RequestDecoder()
    decoder.receive_data(b"".join(codec.encode_request(Info(i)) for i in range(10)))
    assert [m.request_id for m in decoder.next_requests(3)] == [0, 1, 2]
    assert [m.request_id for m in decoder.next_requests(100)] == list(range(3, 10))
    assert decoder.next_requests(100) == []


def test_a_truncated_frame_waits_for_its_remaining_bytes() -> None:
    frame = codec.encode_add_entry(5, 1, 2, b"payload", master_key=b"k")
    decoder = codec.RequestDecoder()
    for byte in frame[:-1]:
        decoder.receive_data(bytes([byte]))
        assert decoder.next_requests(10) == []
    assert decoder.buffered_bytes == len(frame) - 1
    decoder.receive_data(frame[-1:])
    assert decoder.next_requests(10) == [AddEntry(5, 1, 2, -1, b"k", b"payload", False)]


def test_an_oversized_length_prefix_is_refused_from_its_first_four_bytes() -> None:
    decoder = codec.RequestDecoder(frame_bytes_max=1024)
    decoder.receive_data(struct.pack(">I", 1025))
    with pytest.raises(ProtocolError, match="exceeds this peer's limit of 1024") as caught:
        decoder.next_requests(10)
    assert caught.value.status == f.Status.TOO_LARGE
    assert caught.value.request_id is None
    # nothing of it is kept, and the decoder stays failed
    assert decoder.buffered_bytes == 0
    with pytest.raises(ProtocolError):
        decoder.next_requests(10)


def test_an_oversized_frame_with_a_header_names_its_request_id() -> None:
    decoder = codec.RequestDecoder(frame_bytes_max=1024)
    big = codec.encode_add_entry(42, 1, 0, b"x" * 2000)
    decoder.receive_data(big[:100])  # the body never arrives: refused on the header
    with pytest.raises(ProtocolError) as caught:
        decoder.next_requests(10)
    assert (caught.value.status, caught.value.request_id) == (f.Status.TOO_LARGE, 42)
    assert caught.value.opcode == f.Opcode.ADD_ENTRY


def _frame(version: int, opcode: int, flags: int, status: int, rid: int, body: bytes) -> bytes:
    return f.HEADER.pack(12 + len(body), version, opcode, flags, status, rid) + body


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (_frame(2, 9, 0, 0, 7, b""), "protocol version 2"),
        (_frame(1, 99, 0, 0, 7, b""), "unknown opcode 99"),
        (_frame(1, 9, 0, 3, 7, b""), "carries status 3"),
        (_frame(1, 9, 0x80, 0, 7, b""), "response flag"),
        (_frame(1, 9, 0, 0, 7, b"x"), "INFO body of 1 bytes"),
        (_frame(1, 4, 0, 0, 7, b"\0" * 7), "READ_LAC body of 7 bytes"),
        (_frame(1, 5, 0, 0, 7, struct.pack(">qB", 1, 200) + b"k"), "key does not end"),
        (_frame(1, 1, 0, 0, 7, struct.pack(">qqqB", 1, 2, 3, 200) + b"k"), "runs past the end"),
        (_frame(1, 1, 0x02, 0, 7, struct.pack(">qqqB", 1, 2, 3, 0)), "unknown flags 0x02"),
        (_frame(1, 1, 0, 0, 7, b"\0" * 10), "ADD_ENTRY body of 10 bytes"),
        (_frame(1, 2, 0x04, 0, 7, struct.pack(">qqIB", 1, 2, 0, 0)), "unknown flags 0x04"),
    ],
)
def test_malformed_requests_are_bad_requests_naming_their_id(frame: bytes, reason: str) -> None:
    decoder = codec.RequestDecoder()
    good = codec.encode_request(Info(1))
    decoder.receive_data(good + frame + good)
    assert decoder.next_requests(10) == [Info(1)]  # the good frame before it is served
    with pytest.raises(ProtocolError, match=reason) as caught:
        decoder.next_requests(10)
    assert (caught.value.status, caught.value.request_id) == (f.Status.BAD_REQUEST, 7)


def test_a_length_below_the_header_is_a_bad_request() -> None:
    decoder = codec.RequestDecoder()
    decoder.receive_data(struct.pack(">I", 3) + b"abc")
    with pytest.raises(ProtocolError, match="below the header") as caught:
        decoder.next_requests(10)
    assert caught.value.status == f.Status.BAD_REQUEST


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_give_requests_or_a_protocol_error_and_nothing_else(data: bytes) -> None:
    decoder = codec.RequestDecoder(frame_bytes_max=4096)
    decoder.receive_data(data)
    try:
        decoder.next_requests(1000)
    except ProtocolError as error:
        assert error.status in (f.Status.BAD_REQUEST, f.Status.TOO_LARGE)
    assert decoder.buffered_bytes <= len(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_to_a_client_decoder_give_a_protocol_error_at_worst(data: bytes) -> None:
    decoder = codec.ResponseDecoder(frame_bytes_max=4096)
    decoder.receive_data(data)
    with contextlib.suppress(ProtocolError):
        decoder.next_responses()


def test_the_buffer_refuses_to_grow_past_its_bound() -> None:
    decoder = codec.RequestDecoder(frame_bytes_max=100, receive_bytes_max=100)
    frames = b"".join(codec.encode_request(Info(i)) for i in range(20))  # 320 bytes
    decoder.receive_data(frames[:150])
    with pytest.raises(RuntimeError, match="over its bound"):
        decoder.receive_data(frames[150:])  # complete frames were left untaken


def test_a_master_key_longer_than_the_protocol_carries_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 255"):
        codec.encode_add_entry(1, 1, 1, b"", master_key=b"k" * 256)


def test_master_key_derivation_is_stable_and_domain_separated() -> None:
    key = master_key_from_password("secret")
    assert key == master_key_from_password(b"secret")
    assert len(key) == 32
    # a fixed vector: changing the derivation would lock every existing ledger
    assert key.hex() == "bae544f6f2e776f761b258777bc7c7062e723f0d0ba90978f413b48a57903649"
    assert key != hashlib.sha256(b"secret").digest()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(i64, payloads), max_size=30),
    keys,
    i64,
    st.booleans(),
)
def test_a_batch_of_add_frames_is_the_same_as_one_frame_each(
    entries: list[tuple[int, bytes]], key: bytes, lac: int, recovery: bool
) -> None:
    batch = codec.encode_add_entries(
        100, 7, entries, master_key=key, last_add_confirmed=lac, recovery=recovery
    )
    one_by_one = b"".join(
        codec.encode_add_entry(
            100 + i, 7, e, p, master_key=key, last_add_confirmed=lac, recovery=recovery
        )
        for i, (e, p) in enumerate(entries)
    )
    assert batch == one_by_one
    decoder = codec.RequestDecoder()
    decoder.receive_data(batch)
    assert decoder.next_requests(100) == [
        AddEntry(100 + i, 7, e, lac, key, p, recovery) for i, (e, p) in enumerate(entries)
    ]


# --- the load generator's lean paths -----------------------------------------------------------

#: responses other than OK adds, which next_add_outcomes gives back as messages
other_responses = responses.filter(lambda m: not isinstance(m, AddEntryResponse))
ok_adds = st.builds(AddEntryResponse, ids, i64, i64)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(ok_adds, min_size=1, max_size=80),  # runs, to exercise the bulk path
            other_responses.map(lambda m: [m]),
        ),
        max_size=12,
    ),
    st.lists(st.integers(0, 10**6), max_size=8),
)
def test_add_outcomes_are_the_ok_ids_and_every_other_response_however_split(
    groups: list[list[ResponseMessage]], cuts: list[int]
) -> None:
    messages = [m for group in groups for m in group]
    stream = b"".join(codec.encode_response(m) for m in messages)
    decoder = codec.ResponseDecoder()
    ok_ids: list[int] = []
    others: list[ResponseMessage] = []
    for piece in _split(stream, cuts):
        decoder.receive_data(piece)
        outcomes = decoder.next_add_outcomes()
        ok_ids += outcomes.ok_request_ids
        others += outcomes.others
    assert ok_ids == [m.request_id for m in messages if isinstance(m, AddEntryResponse)]
    assert others == [m for m in messages if not isinstance(m, AddEntryResponse)]
    assert decoder.buffered_bytes == 0


def test_add_outcomes_of_long_runs_broken_by_errors() -> None:
    """Runs longer than one bulk step, errors between them, fed in odd-sized pieces."""
    messages: list[ResponseMessage] = []
    for request_id in range(10_000):
        if request_id % 3001 == 7:
            messages.append(ErrorResponse(request_id, 1, f.Status.FENCED, 5, request_id, "no"))
        else:
            messages.append(AddEntryResponse(request_id, 5, request_id))
    stream = b"".join(codec.encode_response(m) for m in messages)
    decoder = codec.ResponseDecoder()
    ok_ids: list[int] = []
    error_ids: list[int] = []
    for start in range(0, len(stream), 65_521):
        decoder.receive_data(stream[start : start + 65_521])
        outcomes = decoder.next_add_outcomes()
        ok_ids += outcomes.ok_request_ids
        error_ids += [m.request_id for m in outcomes.others]
    assert error_ids == [7, 3008, 6009, 9010]
    assert ok_ids == [i for i in range(10_000) if i not in error_ids]


def _ok_add_frame(request_id: int) -> bytes:
    return codec.encode_response(AddEntryResponse(request_id, 5, request_id))


def _mutate(frame: bytes, how: str) -> bytes:
    if how == "version":
        return frame[:4] + b"\x02" + frame[5:]
    if how == "flags without RESPONSE":
        return frame[:6] + b"\x00" + frame[7:]
    if how == "unknown flag":
        return frame[:6] + b"\x81" + frame[7:]
    if how == "body too long":
        return struct.pack(">I", 36) + frame[4:] + b"\0" * 8
    assert how == "body too short"
    return struct.pack(">I", 20) + frame[4:24]


@pytest.mark.parametrize(
    "how", ["version", "flags without RESPONSE", "unknown flag", "body too long", "body too short"]
)
@pytest.mark.parametrize("good_before", [0, 1, 40, 3000])
def test_a_malformed_ok_add_response_is_never_counted_as_success(
    how: str, good_before: int
) -> None:
    stream = b"".join(_ok_add_frame(i) for i in range(good_before))
    stream += _mutate(_ok_add_frame(good_before), how)
    stream += b"".join(_ok_add_frame(i) for i in range(good_before + 1, good_before + 50))
    decoder = codec.ResponseDecoder()
    decoder.receive_data(stream)
    if good_before:
        outcomes = decoder.next_add_outcomes()  # the good ones before it, then failed
        assert outcomes.ok_request_ids == list(range(good_before))
        assert outcomes.others == []
    with pytest.raises(ProtocolError, match=f"ADD_ENTRY response {good_before}") as caught:
        decoder.next_add_outcomes()
    assert caught.value.request_id == good_before
    with pytest.raises(ProtocolError):  # and the decoder stays failed
        decoder.next_add_outcomes()


def test_add_outcomes_keep_the_frame_size_bound() -> None:
    decoder = codec.ResponseDecoder(frame_bytes_max=1000)
    error = codec.encode_error(9, 1, f.Status.FENCED, "x" * 2000)
    decoder.receive_data(_ok_add_frame(1) + error[:100])
    assert decoder.next_add_outcomes().ok_request_ids == [1]
    with pytest.raises(ProtocolError, match="exceeds this peer's limit") as caught:
        decoder.next_add_outcomes()
    assert caught.value.status == f.Status.TOO_LARGE


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_give_add_outcomes_or_a_protocol_error_and_nothing_else(data: bytes) -> None:
    decoder = codec.ResponseDecoder(frame_bytes_max=4096)
    decoder.receive_data(data)
    with contextlib.suppress(ProtocolError):
        decoder.next_add_outcomes()


@settings(max_examples=100, deadline=None)
@given(
    i64,
    payloads,
    keys,
    i64,
    st.booleans(),
    st.lists(st.tuples(ids, i64, st.integers(0, 8)), min_size=1, max_size=5),
)
def test_repeated_add_frames_are_those_of_encode_add_entries(
    ledger_id: int,
    payload: bytes,
    key: bytes,
    lac: int,
    recovery: bool,
    calls: list[tuple[int, int, int]],
) -> None:
    frames = codec.RepeatedAddFrames(
        ledger_id, payload, 8, master_key=key, last_add_confirmed=lac, recovery=recovery
    )
    for request_id, entry_id, count in calls:
        # ids near the top of their range would overflow; keep every one valid
        first_request_id = min(request_id, 2**64 - 1 - count)
        first_entry_id = min(entry_id, 2**63 - 1 - count)
        entries = [(first_entry_id + i, payload) for i in range(count)]
        expected = codec.encode_add_entries(
            first_request_id,
            ledger_id,
            entries,
            master_key=key,
            last_add_confirmed=lac,
            recovery=recovery,
        )
        assert bytes(frames.frames(first_request_id, first_entry_id, count)) == expected


def test_repeated_add_frames_refuse_more_than_their_capacity() -> None:
    frames = codec.RepeatedAddFrames(1, b"p", 4)
    with pytest.raises(ValueError, match=r"count must be in \[0, 4\]"):
        frames.frames(0, 0, 5)
