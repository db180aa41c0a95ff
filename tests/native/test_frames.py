"""Frame/record codec: round trips, twin byte equality, torn tails, bit flips, bad input."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from native.errors import CodecError, CorruptSegmentHeader
from native.format import (
    FRAME_HEADER_BYTES,
    MAX_RECORD_BYTES,
    SEGMENT_HEADER_BYTES,
    STOP_BAD_LENGTH,
    STOP_CRC,
    STOP_OFFSET,
    STOP_RECORD,
    STOP_TORN,
    Record,
)
from tests.native.strategies import message_lists, messages, offsets, sample_messages

# The codec fixture only selects a module; it holds no state Hypothesis could leak.
FIXTURE_OK = settings(max_examples=150, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


def _expected(first, msgs):
    return [Record(first + i, t, k, dict(a or {}), bytes(p)) for i, (t, k, a, p) in enumerate(msgs)]


@FIXTURE_OK
@given(first=offsets, msgs=message_lists)
def test_batch_round_trip(codec, first, msgs):
    buf = codec.encode_batch(first, msgs)
    scan = codec.scan_frames(buf, expected_offset=first, positions=True)
    assert scan.error is None and scan.end == len(buf)
    assert scan.records == _expected(first, msgs)
    assert (scan.count, scan.first_offset, scan.last_offset) == (len(msgs), first, first + len(msgs) - 1)
    assert all(type(r) is Record for r in scan.records)
    # Each frame on its own is the same bytes as its slice of the batch.
    ends = scan.positions[1:] + [len(buf)]
    for i, (start, end) in enumerate(zip(scan.positions, ends)):
        assert codec.encode_frame(first + i, *msgs[i]) == buf[start:end]


@settings(max_examples=200, deadline=None)
@given(first=offsets, msgs=message_lists)
def test_twins_produce_identical_bytes_and_results(first, msgs):
    twins = native.available_codecs()
    batches = {t.IMPLEMENTATION: t.encode_batch(first, msgs) for t in twins}
    assert len(set(batches.values())) == 1
    buf = next(iter(batches.values()))
    for t in twins:
        assert t.encode_record(*msgs[0]) == native.codec.encode_record(*msgs[0])
        assert t.scan_frames(buf, positions=True) == twins[0].scan_frames(buf, positions=True)
        assert t.scan_frames(buf, decode=False) == twins[0].scan_frames(buf, decode=False)


@FIXTURE_OK
@given(msg=messages)
def test_record_round_trip(codec, msg):
    t, k, a, p = msg
    assert codec.decode_record(5, codec.encode_record(*msg)) == Record(5, t, k, dict(a or {}), p)


def test_every_truncation_point_of_frames_is_torn(codec):
    msgs = sample_messages(4)
    buf = codec.encode_batch(100, msgs)
    starts = codec.scan_frames(buf, positions=True).positions + [len(buf)]
    for cut in range(len(buf) + 1):
        scan = codec.scan_frames(buf[:cut], expected_offset=100)
        whole = sum(1 for end in starts[1:] if end <= cut)
        assert scan.count == whole
        assert scan.records == _expected(100, msgs[:whole])
        assert scan.end == starts[whole]
        if cut == starts[whole]:
            assert scan.error is None
        else:
            assert scan.error.reason == STOP_TORN and scan.error.position == starts[whole]


def test_every_single_bit_flip_is_detected(codec):
    msgs = sample_messages(3, payload_bytes=20)
    buf = codec.encode_batch(7, msgs)
    good = _expected(7, msgs)
    first_len = codec.scan_frames(buf, positions=True).positions[1]
    for byte in range(first_len):  # every bit of the first frame, header included
        for bit in range(8):
            bad = bytearray(buf)
            bad[byte] ^= 1 << bit
            scan = codec.scan_frames(bytes(bad), expected_offset=7)
            assert scan.count == 0 and scan.records == []
            assert scan.error.position == 0
            assert scan.error.reason in (STOP_CRC, STOP_BAD_LENGTH, STOP_TORN)
    rng = random.Random(42)
    for _ in range(500):  # random flips anywhere: never a wrong record
        bad = bytearray(buf)
        for _ in range(rng.randint(1, 3)):
            bad[rng.randrange(len(bad))] ^= 1 << rng.randrange(8)
        scan = codec.scan_frames(bytes(bad), expected_offset=7)
        assert scan.records == good[:scan.count]
        assert scan.error is not None or bytes(bad) == buf


def test_stop_reasons_and_positions(codec):
    a = codec.encode_frame(10, 1, None, None, b"a")
    b = codec.encode_frame(12, 1, None, None, b"b")
    scan = codec.scan_frames(a + b, expected_offset=10)
    assert scan.count == 1 and scan.error.reason == STOP_OFFSET and scan.error.position == len(a)
    scan = codec.scan_frames(a + bytes(64))  # a pre-allocated, zeroed tail
    assert scan.count == 1 and scan.error.reason == STOP_BAD_LENGTH and scan.error.position == len(a)
    # A record the CRC vouches for but the record parser refuses (unknown version).
    body = bytearray(codec.encode_record(1, None, None, b"x"))
    body[0] = 9
    frame = bytearray(FRAME_HEADER_BYTES) + body
    frame[4:8] = len(body).to_bytes(4, "little")
    frame[8:16] = (11).to_bytes(8, "little")
    frame[0:4] = codec.crc32c(bytes(frame[4:])).to_bytes(4, "little")
    scan = codec.scan_frames(a + bytes(frame))
    assert scan.error.reason == STOP_RECORD and scan.error.position == len(a)
    assert "version 9" in scan.error.detail
    assert codec.scan_frames(a + bytes(frame), decode=False).error is None


def test_scan_window_and_max_frames(codec):
    buf = codec.encode_batch(0, sample_messages(5))
    pos = codec.scan_frames(buf, positions=True).positions
    scan = codec.scan_frames(buf, pos[1], pos[3], 1)
    assert (scan.count, scan.first_offset, scan.last_offset, scan.end, scan.error) == (2, 1, 2, pos[3], None)
    scan = codec.scan_frames(buf, max_frames=2)
    assert (scan.count, scan.end, scan.error) == (2, pos[2], None)
    empty = codec.scan_frames(b"")
    assert (empty.count, empty.first_offset, empty.last_offset, empty.end, empty.error) == (0, -1, -1, 0, None)
    with pytest.raises(CodecError):
        codec.scan_frames(buf, -1)
    with pytest.raises(CodecError):
        codec.scan_frames(buf, expected_offset=2**64)


def test_frame_layout_matches_spec(codec):
    frame = codec.encode_frame(0x0102030405060708, 9, b"K", {"a": "b"}, b"pay")
    record = codec.encode_record(9, b"K", {"a": "b"}, b"pay")
    assert frame[16:] == record and int.from_bytes(frame[4:8], "little") == len(record)
    assert frame[8:16] == bytes.fromhex("0807060504030201")
    assert int.from_bytes(frame[:4], "little") == codec.crc32c(frame[4:])
    assert record == (b"\x01\x03" + (9).to_bytes(8, "little") + (1).to_bytes(4, "little") + b"K"
                      + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + b"a"
                      + (1).to_bytes(4, "little") + b"b" + b"pay")
    # An empty key is present-and-empty, distinct from no key; an empty mapping is "none".
    assert codec.decode_record(0, codec.encode_record(1, b"", {}, b"")).key == b""
    assert codec.decode_record(0, codec.encode_record(1, None, {}, b"")).key is None


@pytest.mark.parametrize("args", [
    (-1, None, None, b""),                   # negative publish_time
    (2**64, None, None, b""),                # publish_time beyond u64
    (1.5, None, None, b""),                  # not an int
    (1, "key", None, b""),                   # str key
    (1, 5, None, b""),                       # int key (bytes(5) would be 5 zero bytes)
    (1, None, {"a": 1}, b""),                # non-str attribute value
    (1, None, {1: "a"}, b""),                # non-str attribute name
    (1, None, {"a": "\ud800"}, b""),         # lone surrogate: not encodable
    (1, None, [("a", "b")], b""),            # not a mapping
    (1, None, {"x" * 70_000: "v"}, b""),     # attribute name over u16
    (1, None, None, "payload"),              # str payload
    (1, None, None, 3),                      # int payload
])
def test_bad_input_is_a_codec_error(codec, args):
    with pytest.raises(CodecError):
        codec.encode_frame(0, *args)
    with pytest.raises(CodecError):
        codec.encode_batch(0, [(1, None, None, b"ok"), args])


def test_bad_offsets_and_messages(codec):
    for offset in (-1, 2**64, "1", None):
        with pytest.raises(CodecError):
            codec.encode_frame(offset, 1, None, None, b"")
    with pytest.raises(CodecError):
        codec.encode_batch(2**64 - 1, [(1, None, None, b"")] * 2)  # second offset past u64
    assert codec.encode_batch(2**64 - 1, [(1, None, None, b"")])  # the last u64 is fine
    for bad in ([(1, None, None)], [b"not a tuple"], [None]):
        with pytest.raises(CodecError):
            codec.encode_batch(0, bad)
    assert codec.encode_batch(0, []) == b""


def test_oversize_record_is_refused(codec):
    payload = bytes(MAX_RECORD_BYTES)  # + the 10-byte fixed part: one past the limit
    with pytest.raises(CodecError, match="exceeds the format limit"):
        codec.encode_frame(0, 1, None, None, payload)
    with pytest.raises(CodecError, match="exceeds the format limit"):
        codec.encode_batch(0, [(1, None, None, payload)])
    assert len(codec.encode_frame(0, 1, None, None, payload[:-10])) == MAX_RECORD_BYTES + 16


def test_bytes_like_inputs_are_accepted(codec):
    ref = codec.encode_frame(1, 2, b"k", None, b"payload")
    assert codec.encode_frame(1, 2, bytearray(b"k"), None, memoryview(b"payload")) == ref
    assert codec.scan_frames(bytearray(ref)).records == codec.scan_frames(memoryview(ref)).records


def test_segment_header_round_trip_and_rejections(codec):
    head = codec.encode_segment_header(123, 1_700_000_000_000)
    assert len(head) == SEGMENT_HEADER_BYTES
    assert codec.decode_segment_header(head) == (123, 1_700_000_000_000)
    for twin in native.available_codecs():
        assert twin.encode_segment_header(123, 1_700_000_000_000) == head

    def resealed(mutate):
        raw = bytearray(head)
        mutate(raw)
        raw[28:32] = codec.crc32c(bytes(raw[:28])).to_bytes(4, "little")
        return bytes(raw)

    cases = {
        "truncated": head[:31],
        "magic": resealed(lambda r: r.__setitem__(slice(0, 4), b"XXXX")),
        "CRC": head[:8] + b"\x01" + head[9:],
        "version": resealed(lambda r: r.__setitem__(slice(4, 6), (4).to_bytes(2, "little"))),
        "version 0": resealed(lambda r: r.__setitem__(slice(4, 6), (0).to_bytes(2, "little"))),
        "flags": resealed(lambda r: r.__setitem__(slice(6, 8), (1).to_bytes(2, "little"))),
    }
    for what, raw in cases.items():
        with pytest.raises(CorruptSegmentHeader):
            codec.decode_segment_header(raw)
    for bad in ((-1, 0), (0, 2**64), ("0", 0)):
        with pytest.raises(CodecError):
            codec.encode_segment_header(*bad)


# ------------------------------------------------------------------ commit rounds (formats 2 and 3)

def _rounds_buffer(codec, first: int, msgs: list, cuts: list[int], key: int | None = None) -> bytes:
    """Frames of ``msgs`` from ``first``, with a round marker before frame 0 and each cut
    (keyed with ``key``, format 3, unless None)."""
    out, start = [], 0
    for end in sorted(set(cuts) | {len(msgs)}):
        if end <= start:
            continue
        out.append(codec.encode_round_marker(first + start, key))
        out.append(codec.encode_batch(first + start, msgs[start:end]))
        start = end
    return b"".join(out)


def test_round_marker_bytes_are_the_spec():
    for twin in native.available_codecs():
        marker = twin.encode_round_marker(5)
        assert marker[4:] == b"\xff\xff\xff\xff" + (5).to_bytes(8, "little")
        assert int.from_bytes(marker[:4], "little") == twin.crc32c(marker[4:])
        with pytest.raises(CodecError):
            twin.encode_round_marker(-1)


def test_keyed_round_marker_bytes_are_the_spec():
    # Format 3: the CRC goes on over the segment's marker key (u32, little-endian).
    for twin in native.available_codecs():
        for key in (0, 1, 0x5EED1234, 0xFFFFFFFF):
            marker = twin.encode_round_marker(5, key)
            assert marker[4:] == twin.encode_round_marker(5)[4:]
            assert int.from_bytes(marker[:4], "little") == twin.crc32c(key.to_bytes(4, "little"),
                                                                        twin.crc32c(marker[4:]))
        for bad in (-1, 1 << 32, "1"):
            with pytest.raises(CodecError):
                twin.encode_round_marker(5, bad)
            with pytest.raises(CodecError):
                twin.scan_frames(b"", rounds=True, marker_key=bad)
        with pytest.raises(CodecError, match="no marker key"):
            twin.encode_segment_header(0, 0, version=2, marker_key=7)
        assert twin.encode_segment_header(0, 0, version=3, marker_key=7)[24:28] == (7).to_bytes(4, "little")


@settings(max_examples=100, deadline=None)
@given(first=offsets, msgs=message_lists, key=st.integers(0, 0xFFFFFFFF))
def test_twins_agree_on_keyed_rounds_and_refuse_other_keys(first, msgs, key):
    twins = native.available_codecs()
    buffers = {_rounds_buffer(t, first, msgs, [len(msgs) // 2], key) for t in twins}
    assert len(buffers) == 1, "both twins write the same keyed markers"
    buf = buffers.pop()
    for twin in twins:
        scan = twin.scan_frames(buf, expected_offset=first, positions=True, rounds=True, marker_key=key)
        assert scan.error is None and scan.end == len(buf) and scan.records == _expected(first, msgs)
        for other in (None, key ^ 1):
            if twin.encode_round_marker(first, other) == buf[:16]:
                continue  # a CRC collision (key 0 and first offset 0 give the unkeyed marker)
            assert twin.scan_frames(buf, rounds=True, marker_key=other).error == native.ScanStop(
                0, STOP_CRC, f"CRC mismatch in round marker claiming offset {first}")


@FIXTURE_OK
@given(first=offsets, msgs=message_lists)
def test_rounds_scan_skips_markers_and_checks_them(codec, first, msgs):
    rng = random.Random(len(msgs) * 31 + first % 1000)
    cuts = [rng.randrange(0, len(msgs) + 1) for _ in range(rng.randrange(0, 4))]
    buf = _rounds_buffer(codec, first, msgs, cuts)
    scan = codec.scan_frames(buf, expected_offset=first, positions=True, rounds=True)
    assert scan.error is None and scan.end == len(buf) and scan.records == _expected(first, msgs)
    assert scan.markers[0] == 0 and len(scan.markers) == len({c for c in cuts if 0 < c < len(msgs)}) + 1
    # Without rounds=True a marker is an impossible frame length, as in format version 1.
    assert codec.scan_frames(buf).error == native.ScanStop(0, STOP_BAD_LENGTH, "record length 4294967295")
    # A marker that names another offset, or whose CRC fails, stops the scan there.
    assert codec.scan_frames(buf, expected_offset=first + 1, rounds=True).error.reason == STOP_OFFSET
    bad = bytearray(buf)
    bad[9] ^= 1
    assert codec.scan_frames(bytes(bad), rounds=True).error == native.ScanStop(
        0, STOP_CRC, f"CRC mismatch in round marker claiming offset {first ^ 256}")


@settings(max_examples=200, deadline=None)
@given(first=offsets, msgs=message_lists)
def test_twins_agree_on_rounds_scans_of_damaged_buffers(first, msgs):
    twins = native.available_codecs()
    rng = random.Random(first % 9973 + len(msgs))
    cuts = [rng.randrange(0, len(msgs) + 1) for _ in range(3)]
    buffers = {_rounds_buffer(t, first, msgs, cuts) for t in twins}
    assert len(buffers) == 1, "both twins write the same markers and frames"
    buf = buffers.pop()
    for _ in range(5):
        damaged = bytearray(buf[:rng.randrange(0, len(buf) + 1)])
        if damaged:
            damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        for decode in (True, False):
            results = [t.scan_frames(bytes(damaged), 0, None, first, decode, True, None, True) for t in twins]
            assert all(r == results[0] for r in results), results
