"""native.columns: both twins give identical Arrow buffers, filter exactly, refuse bad records."""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from native import _columns_py, columns, format as fmt
from native.columns import ColumnsError, ColumnsTooLarge
from native.errors import CodecError
from tests.native.strategies import attributes, keys, payloads, sample_messages

TWINS = columns.available_twins()
FIXTURE_OK = settings(max_examples=80, deadline=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture])
INT64_MAX = 2**63 - 1
# Arrow's int64 columns hold these: the decoder refuses anything above.
times = st.integers(min_value=0, max_value=INT64_MAX)
messages = st.lists(st.tuples(times, keys, attributes, payloads), min_size=0, max_size=40)


def test_the_cython_twin_loaded_unless_python_is_forced():
    """A silent fallback would leave the Spark reader on the slow path and this suite green."""
    if columns.FORCED_PYTHON:
        assert columns.IMPLEMENTATION == "python"
        return
    assert columns.NATIVE_IMPORT_ERROR is None, columns.NATIVE_IMPORT_ERROR
    assert columns.IMPLEMENTATION == "cython"
    assert [t.IMPLEMENTATION for t in TWINS] == ["python", "cython"]


def test_cython_constants_match_the_format():
    if len(TWINS) < 2:
        pytest.skip("Cython twin not built")
    for name, value in TWINS[1].FORMAT_CONSTANTS.items():
        assert getattr(fmt, name) == value, name


def _all_twins(frames, *args, **kw):
    results = [twin.decode_columns(frames, *args, **kw) for twin in TWINS]
    for r in results[1:]:
        assert r == results[0]
    return results[0]


def _rows(c):
    """The buffers read back as plain rows (independent of Arrow)."""
    def ints(buf, width):
        return list(struct.unpack(f"<{len(buf) // width}{'qi'[width == 4]}", buf))

    ko, po, ao = ints(c.key_offsets, 4), ints(c.payload_offsets, 4), ints(c.attribute_offsets, 4)
    no, vo = ints(c.attribute_names_offsets, 4), ints(c.attribute_values_offsets, 4)
    names = [c.attribute_names_data[no[e]:no[e + 1]].decode() for e in range(c.attribute_count)]
    values = [c.attribute_values_data[vo[e]:vo[e + 1]].decode() for e in range(c.attribute_count)]
    out = []
    for i, (offset, time_ms) in enumerate(zip(ints(c.offsets, 8), ints(c.publish_times_ms, 8))):
        present = c.key_validity[i >> 3] >> (i & 7) & 1
        key = c.key_data[ko[i]:ko[i + 1]] if present else None
        if not present:
            assert ko[i] == ko[i + 1]
        attrs = dict(zip(names[ao[i]:ao[i + 1]], values[ao[i]:ao[i + 1]]))
        out.append((offset, time_ms, key, attrs, c.payload_data[po[i]:po[i + 1]]))
    return out


def _records(frames):
    return [(r.offset, r.publish_time, r.key, r.attributes, r.payload)
            for r in native.scan_frames(frames).records]


@FIXTURE_OK
@given(first=st.integers(0, 2**40), msgs=messages)
def test_twins_agree_with_the_record_decoder(first, msgs):
    frames = native.encode_batch(first, msgs)
    c = _all_twins(frames)
    assert _rows(c) == _records(frames)
    assert c.count == c.frame_count == len(msgs)
    assert c.key_null_count == sum(m[1] is None for m in msgs)
    assert (c.first_frame_offset, c.last_frame_offset) == (
        (first, first + len(msgs) - 1) if msgs else (None, None))
    assert len(c.key_validity) == (len(msgs) + 7) // 8


@FIXTURE_OK
@given(msgs=st.lists(st.tuples(times, keys, attributes, payloads), min_size=1, max_size=40),
       lo=st.none() | st.integers(-5, 60), hi=st.none() | st.integers(-5, 60),
       tlo=st.none() | st.integers(0, INT64_MAX), thi=st.none() | st.integers(0, INT64_MAX))
def test_range_filter_keeps_exactly_the_rows_inside(msgs, lo, hi, tlo, thi):
    frames = native.encode_batch(10, msgs)
    c = _all_twins(frames, lo, hi, tlo, thi)
    want = [r for r in _records(frames)
            if (lo is None or r[0] >= lo) and (hi is None or r[0] <= hi)
            and (tlo is None or r[1] >= tlo) and (thi is None or r[1] <= thi)]
    assert _rows(c) == want
    assert c.frame_count == len(msgs)  # every frame validated, whatever the filter


def test_keys_none_empty_and_attributes_are_kept_apart():
    msgs = [(1, None, None, b"a"), (2, b"", None, b""), (3, b"k", {"x": "1", "é": "✓"}, b"p"),
            (4, None, {"": ""}, b"q")]
    c = _all_twins(native.encode_batch(0, msgs))
    assert _rows(c) == [(0, 1, None, {}, b"a"), (1, 2, b"", {}, b""),
                        (2, 3, b"k", {"x": "1", "é": "✓"}, b"p"), (3, 4, None, {"": ""}, b"q")]
    assert c.key_validity == bytes([0b0110]) and c.key_null_count == 2
    assert c.attribute_count == 3


def test_sample_messages_and_a_memoryview_input():
    frames = native.encode_batch(7, sample_messages(300))
    assert _rows(_all_twins(memoryview(frames))) == _records(frames)


def _frame(offset, record):
    body = struct.pack("<IQ", len(record), offset) + record
    return struct.pack("<I", native.crc32c(body)) + body


def _record(flags=0, time_ms=5, version=1, rest=b""):
    return struct.pack("<BBQ", version, flags, time_ms) + rest


GOOD = _frame(0, _record(rest=b"payload"))
BAD = [
    ("truncated header", GOOD + GOOD[:10], len(GOOD)),
    ("runs past the end", GOOD + GOOD[:-1], len(GOOD)),
    ("short record", GOOD + _frame(1, b"\x01\x00"), len(GOOD)),
    ("offset gap", GOOD + _frame(2, _record()), len(GOOD)),
    ("offset past int64", _frame(2**63, _record()), 0),
    ("version", GOOD + _frame(1, _record(version=2)), len(GOOD)),
    ("flags", GOOD + _frame(1, _record(flags=4)), len(GOOD)),
    ("time past int64", _frame(0, _record(time_ms=2**63)), 0),
    ("key runs past", _frame(0, _record(flags=1, rest=struct.pack("<I", 9) + b"abc")), 0),
    ("key length cut", _frame(0, _record(flags=1, rest=b"\x01\x00")), 0),
    ("zero attributes", _frame(0, _record(flags=2, rest=b"\x00\x00")), 0),
    ("attribute cut", _frame(0, _record(flags=2, rest=b"\x01\x00\x05\x00ab")), 0),
    ("attribute not utf-8", _frame(0, _record(flags=2, rest=b"\x01\x00\x01\x00\xff\x00\x00\x00\x00")), 0),
    ("repeated name", _frame(0, _record(flags=2, rest=b"\x02\x00" + (b"\x01\x00a\x01\x00\x00\x00b") * 2)), 0),
]


@pytest.mark.parametrize("name,frames,position", BAD, ids=[b[0] for b in BAD])
def test_malformed_input_raises_a_typed_error_naming_the_frame(name, frames, position):
    reasons = set()
    for twin in TWINS:
        with pytest.raises(ColumnsError) as info:
            twin.decode_columns(frames)
        assert isinstance(info.value, CodecError)
        assert info.value.position == position and f"frame at byte {position}" in str(info.value)
        reasons.add(info.value.reason)
    assert len(reasons) == 1, reasons  # the twins say the same thing


def test_a_bad_frame_outside_the_range_still_fails():
    frames = GOOD + _frame(1, _record(flags=4))
    for twin in TWINS:
        with pytest.raises(ColumnsError):
            twin.decode_columns(frames, 0, 0)


def test_too_large_refuses_before_allocating():
    frames = native.encode_batch(0, [(1, None, None, b"x" * 100)] * 10)
    for twin in TWINS:
        with pytest.raises(ColumnsTooLarge) as info:
            twin.decode_columns(frames, buffer_bytes_max=999)
        assert info.value.buffer == "payload_data" and info.value.size == 1000
        assert twin.decode_columns(frames, 0, 8, buffer_bytes_max=999).count == 9
    with pytest.raises(ValueError):
        _columns_py.decode_columns(frames, buffer_bytes_max=2**31)


def test_empty_input_and_empty_window():
    c = _all_twins(b"")
    assert (c.count, c.frame_count, c.first_frame_offset) == (0, 0, None)
    assert c.key_offsets == c.payload_offsets == c.attribute_offsets == b"\0\0\0\0"
    frames = native.encode_batch(0, sample_messages(5))
    c = _all_twins(frames, 3, 2)
    assert c.count == 0 and c.frame_count == 5
