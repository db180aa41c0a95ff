"""dnb1 objects: round trips over both twins, identical bytes, truncation, bit flips, bad input."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from native import object_format as of
from native.errors import CodecError, CorruptObject
from tests.native.strategies import message_lists, offsets, sample_messages

FIXTURE_OK = settings(max_examples=60, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])


def _object(codec, count=60, first=1000, block_bytes=2048, zstd_level=0, **kw):
    frames = codec.encode_batch(first, sample_messages(count, **kw))
    return frames, of.write_object(frames, topic="ns/topic", block_bytes=block_bytes,
                                   zstd_level=zstd_level, codec=codec)


@FIXTURE_OK
@given(first=offsets, msgs=message_lists, block_bytes=st.integers(1, 5000),
       zstd_level=st.sampled_from([0, 1, 3]))
def test_round_trip(codec, first, msgs, block_bytes, zstd_level):
    frames = codec.encode_batch(first, msgs)
    obj = of.write_object(frames, topic="t", block_bytes=block_bytes, zstd_level=zstd_level,
                          codec=codec)
    records = of.read_records(obj, "o", codec=codec)
    assert records == codec.scan_frames(frames).records
    assert of.read_all_frames(obj, "o", codec=codec) == frames
    footer = of.parse_footer(obj, "o", len(obj), codec=codec)
    assert (footer.first_offset, footer.last_offset, footer.message_count) == (
        first, first + len(msgs) - 1, len(msgs))
    assert (footer.min_publish_time, footer.max_publish_time) == (
        min(m[0] for m in msgs), max(m[0] for m in msgs))
    for block in footer.blocks:  # every block within target unless it is one big frame
        assert block.raw_bytes <= block_bytes or block.first_offset == block.last_offset


@settings(max_examples=60, deadline=None)
@given(first=offsets, msgs=message_lists, block_bytes=st.integers(1, 3000),
       zstd_level=st.sampled_from([0, 1, 3]))
def test_twins_produce_identical_objects(first, msgs, block_bytes, zstd_level):
    twins = native.available_codecs()
    frames = twins[0].encode_batch(first, msgs)
    objs = {of.write_object(frames, topic="tópic", block_bytes=block_bytes, zstd_level=zstd_level,
                            codec=t) for t in twins}
    assert len(objs) == 1
    obj = objs.pop()
    results = [(of.parse_footer(obj, "o", len(obj), codec=t), of.read_records(obj, "o", codec=t))
               for t in twins]
    assert all(r == results[0] for r in results)


def test_layout_and_footer_fetch_with_one_get(codec):
    frames, obj = _object(codec, 200)
    assert obj[:4] == b"DNB1" and obj[-4:] == b"DNB1"
    footer = of.parse_footer(obj, "o", len(obj), codec=codec)
    header = of.parse_header(obj, "o", codec=codec)
    assert header == of.ObjectHeader("ns/topic", footer.header_bytes)
    assert footer.topic == "ns/topic" and len(footer.blocks) > 3
    assert footer.blocks[0].position == footer.header_bytes
    assert footer.blocks[-1].end == footer.footer_position
    gets = []

    def get_range(start, end):
        gets.append((start, end))
        return obj[start:end]

    assert of.read_footer(get_range, len(obj), "o", codec=codec) == footer
    assert gets == [(max(0, len(obj) - of.FOOTER_GUESS_BYTES), len(obj))]
    gets.clear()
    assert of.read_footer(get_range, len(obj), "o", guess_bytes=20, codec=codec) == footer
    assert len(gets) == 2 and gets[1][1] == len(obj) - 20
    assert of.footer_bytes_needed(obj[-16:], "o", codec=codec) == len(obj) - footer.footer_position


def test_select_and_decode_ranges(codec):
    frames, obj = _object(codec, 120, first=500, block_bytes=1500, zstd_level=1)
    all_records = codec.scan_frames(frames).records
    footer = of.parse_footer(obj, "o", len(obj), codec=codec)
    for lo, hi in ((500, 500), (530, 560), (619, 619), (400, 700), (600, 610)):
        picked = of.select_blocks(footer, lo, hi)
        got = [r for b in picked for r in of.decode_block(obj[b.position:b.end], b, "o",
                                                          first_offset=lo, last_offset=hi, codec=codec)]
        assert got == [r for r in all_records if lo <= r.offset <= hi]
        assert all(b.last_offset >= lo and b.first_offset <= hi for b in picked)
    tmin, tmax = all_records[40].publish_time, all_records[80].publish_time
    got = of.read_records(obj, "o", min_publish_time=tmin, max_publish_time=tmax, codec=codec)
    assert got == [r for r in all_records if tmin <= r.publish_time <= tmax]
    assert of.select_blocks(footer, 10_000, 20_000) == []
    block = footer.blocks[1]
    assert of.block_frames(obj[block.position:block.end], block, "o", codec=codec) == \
        frames[codec.scan_frames(frames, positions=True).positions[block.first_offset - 500]:][
            :block.raw_bytes]


def test_incompressible_blocks_are_stored_as_is(codec):
    import os
    frames = codec.encode_batch(0, [(1, None, None, os.urandom(1000)) for _ in range(10)])
    obj = of.write_object(frames, topic="t", block_bytes=4096, zstd_level=3, codec=codec)
    footer = of.parse_footer(obj, "o", len(obj), codec=codec)
    for b in footer.blocks:
        assert obj[b.position + 4] == of.BLOCK_CODEC_NONE and b.stored_bytes == b.raw_bytes + 16
    _, squeezable = _object(codec, 60, zstd_level=3)
    f2 = of.parse_footer(squeezable, "o", len(squeezable), codec=codec)
    assert any(squeezable[b.position + 4] == of.BLOCK_CODEC_ZSTD for b in f2.blocks)


@pytest.mark.parametrize("zstd_level", [0, 1])
def test_every_truncation_point_is_detected(codec, zstd_level):
    _, obj = _object(codec, 25, block_bytes=600, zstd_level=zstd_level)
    for cut in range(len(obj)):
        with pytest.raises(CorruptObject) as info:
            of.read_records(obj[:cut], "obj-name", codec=codec)
        assert info.value.object_name == "obj-name" and 0 <= info.value.position <= len(obj)
    # A block fetched short (a range GET cut off) is also caught, naming the block start.
    footer = of.parse_footer(obj, "o", len(obj), codec=codec)
    b = footer.blocks[1]
    for cut in range(b.stored_bytes):
        with pytest.raises(CorruptObject) as info:
            of.decode_block(obj[b.position:b.position + cut], b, "o", codec=codec)
        assert info.value.position == b.position


@pytest.mark.parametrize("zstd_level", [0, 1])
def test_bit_flips_never_return_a_wrong_record(zstd_level):
    twins = native.available_codecs()
    _, obj = _object(twins[0], 30, block_bytes=700, zstd_level=zstd_level)
    rng = random.Random(zstd_level)
    flips = [(byte, bit) for byte in range(len(obj)) for bit in range(8)]
    for byte, bit in rng.sample(flips, 1500) if len(flips) > 1500 else flips:
        bad = bytearray(obj)
        bad[byte] ^= 1 << bit
        outcomes = []
        for twin in twins:
            with pytest.raises(CorruptObject) as info:
                of.read_records(bytes(bad), "o", codec=twin)
            outcomes.append((info.value.position, info.value.reason))
        assert all(o == outcomes[0] for o in outcomes), (byte, bit, outcomes)


def test_frame_error_position_inside_stored_block(codec):
    frames, obj = _object(codec, 10, block_bytes=10_000)
    footer = of.parse_footer(obj, "o", len(obj), codec=codec)
    b = footer.blocks[0]
    bad = bytearray(obj[b.position:b.end])
    second_frame = codec.scan_frames(frames, positions=True).positions[1]
    bad[16 + second_frame + 20] ^= 0xFF
    # Re-seal the block CRC so only the frame CRC can catch the damage.
    bad[0:4] = codec.crc32c(bytes(bad[4:])).to_bytes(4, "little")
    with pytest.raises(CorruptObject) as info:
        of.decode_block(bytes(bad), b, "o", codec=codec)
    assert info.value.position == b.position + 16 + second_frame
    assert "crc" in info.value.reason


def _reseal_footer(codec, obj, mutate):
    footer = of.parse_footer(obj, "o", len(obj), codec=codec)
    raw = bytearray(obj)
    start, end = footer.footer_position, len(obj) - of.TRAILER_BYTES
    mutate(raw, start)
    raw[end - 4:end] = codec.crc32c(bytes(raw[start:end - 4])).to_bytes(4, "little")
    return bytes(raw)


def test_bad_versions_and_flags_are_typed_errors(codec):
    _, obj = _object(codec, 20)
    cases = []
    # Header: version and flags (header CRC resealed, so the field check itself must fire).
    for at in (4, 6):
        raw = bytearray(obj)
        raw[at] = 7
        topic_end = 10 + int.from_bytes(raw[8:10], "little")
        raw[topic_end:topic_end + 4] = codec.crc32c(bytes(raw[:topic_end])).to_bytes(4, "little")
        cases.append(bytes(raw))
    # Trailer: version (trailer CRC resealed).
    raw = bytearray(obj)
    raw[-12] = 9
    raw[-8:-4] = codec.crc32c(bytes(raw[-16:-8])).to_bytes(4, "little")
    cases.append(bytes(raw))
    # Footer: version, flags, and a lying message count (footer CRC resealed).
    cases.append(_reseal_footer(codec, obj, lambda r, s: r.__setitem__(s + 4, 2)))
    cases.append(_reseal_footer(codec, obj, lambda r, s: r.__setitem__(s + 6, 1)))
    cases.append(_reseal_footer(codec, obj, lambda r, s: r.__setitem__(s + 24, r[s + 24] + 1)))
    cases.append(_reseal_footer(codec, obj, lambda r, s: r.__setitem__(s + 32, r[s + 32] ^ 1)))
    for raw in cases:
        with pytest.raises(CorruptObject):
            of.read_records(raw, "o", codec=codec)


def test_writer_refuses_bad_input(codec):
    frames = codec.encode_batch(10, sample_messages(5))
    gap = frames + codec.encode_frame(20, 1, None, None, b"x")
    for kwargs in (dict(topic=""), dict(topic=5), dict(topic="t", zstd_level=23),
                   dict(topic="t", zstd_level=-1), dict(topic="t", block_bytes=0),
                   dict(topic="t", block_bytes=2**31 + 1), dict(topic="t", first_offset=11),
                   dict(topic="t", zstd_level="3")):
        with pytest.raises(CodecError):
            of.write_object(frames, codec=codec, **kwargs)
    for bad_frames in (b"", gap, frames[:-1], frames + bytes(20)):
        with pytest.raises(CodecError):
            of.write_object(bad_frames, topic="t", codec=codec)
    assert of.write_object(frames, topic="t", first_offset=10, codec=codec)
