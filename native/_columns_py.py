"""Pure-Python twin of ``native/_columns.pyx``; the specification is ``native/columns.py``.

The types both twins return and raise are shared: :class:`~native.format.Columns` lives in
``native/format.py``, :class:`~native.errors.ColumnsError` and ``ColumnsTooLarge`` in
``native/errors.py``. Import through ``native.columns``, never from a twin directly.
"""
from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable

from native.errors import ColumnsError, ColumnsTooLarge, DnbError
from native.format import (
    COLUMN_BUFFER_BYTES_MAX,
    FRAME_HEADER,
    FRAME_HEADER_BYTES,
    MAX_RECORD_BYTES,
    RECORD_FIXED,
    RECORD_FIXED_BYTES,
    RECORD_FLAG_ATTRIBUTES,
    RECORD_FLAG_KEY,
    RECORD_FLAGS_KNOWN,
    RECORD_VERSION,
    Columns,
)

IMPLEMENTATION = "python"

__all__ = ["decode_columns"]

INT64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1

_U16 = 2
_U32 = 4
# array('i') / array('q') are native-endian; the buffers are specified little-endian.
_SWAP = sys.byteorder == "big"
assert array("i").itemsize == 4 and array("q").itemsize == 8


#: A record's attributes as stored: (name, value) UTF-8 pairs, in order.
_Attributes = list[tuple[bytes, bytes]]
#: One kept row: offset, publish time, key, attributes, payload.
_Row = tuple[int, int, "bytes | None", _Attributes, bytes]


def _window(lo: int | None, hi: int | None) -> tuple[int, int, bool]:
    """An inclusive window clamped to u64, and whether it is empty."""
    lo_v = 0 if lo is None else max(int(lo), 0)
    hi_v = U64_MAX if hi is None else min(int(hi), U64_MAX)
    return min(lo_v, U64_MAX), max(hi_v, 0), lo_v > hi_v


def _buffer_limit(buffer_bytes_max: int | None) -> int:
    if buffer_bytes_max is None:
        return COLUMN_BUFFER_BYTES_MAX
    if not 0 <= buffer_bytes_max <= COLUMN_BUFFER_BYTES_MAX:
        raise ValueError(f"buffer_bytes_max {buffer_bytes_max} outside 0..{COLUMN_BUFFER_BYTES_MAX}")
    return buffer_bytes_max


def decode_columns(frames: bytes | bytearray | memoryview, first_offset: int | None = None, last_offset: int | None = None,
                   min_publish_time: int | None = None, max_publish_time: int | None = None,
                   buffer_bytes_max: int | None = None) -> Columns:
    view = memoryview(frames).cast("B")
    limit = _buffer_limit(buffer_bytes_max)
    olo, ohi, o_empty = _window(first_offset, last_offset)
    tlo, thi, t_empty = _window(min_publish_time, max_publish_time)
    keep_any = not (o_empty or t_empty)
    size = len(view)
    # Every frame takes at least a header and a fixed record part: the loop's hard bound.
    frames_max = size // (FRAME_HEADER_BYTES + RECORD_FIXED_BYTES) + 1
    kept: list[_Row] = []
    pos = frame_count = 0
    first = last = None
    while pos < size and frame_count < frames_max:
        offset, time_ms, key, attributes, payload, end = _frame(view, pos, last)
        if keep_any and olo <= offset <= ohi and tlo <= time_ms <= thi:
            kept.append((offset, time_ms, key, attributes, payload))
        first = offset if first is None else first
        last = offset
        frame_count += 1
        pos = end
    assert pos == size, "the frame loop stops only at the end of the buffer"
    return _build(kept, limit, frame_count, first, last)


def _frame(view: memoryview, pos: int, previous: int | None) -> tuple[int, int, bytes | None, _Attributes, bytes, int]:
    """One validated frame at ``pos``: its fields and the position just past it."""
    size = len(view)
    if size - pos < FRAME_HEADER_BYTES:
        raise ColumnsError(pos, f"frame header needs {FRAME_HEADER_BYTES} bytes, {size - pos} left")
    _crc, length, offset = FRAME_HEADER.unpack_from(view, pos)
    if not RECORD_FIXED_BYTES <= length <= MAX_RECORD_BYTES:
        raise ColumnsError(pos, f"record length {length} outside {RECORD_FIXED_BYTES}..{MAX_RECORD_BYTES}")
    if length > size - pos - FRAME_HEADER_BYTES:
        raise ColumnsError(pos, f"record of {length} bytes runs past the end "
                                f"({size - pos - FRAME_HEADER_BYTES} bytes left)")
    if previous is not None and offset != previous + 1:
        raise ColumnsError(pos, f"offset {offset} does not follow {previous}")
    if offset > INT64_MAX:
        raise ColumnsError(pos, f"offset {offset} exceeds int64")
    start = pos + FRAME_HEADER_BYTES
    try:
        fields = _record(view[start:start + length])
    except _RecordError as e:
        raise ColumnsError(pos, str(e)) from None
    return (offset, *fields, start + length)


class _RecordError(DnbError):
    pass


def _record(r: memoryview) -> tuple[int, bytes | None, _Attributes, bytes]:
    n = len(r)
    version, flags, time_ms = RECORD_FIXED.unpack_from(r, 0)
    if version != RECORD_VERSION:
        raise _RecordError(f"unsupported record version {version}")
    if flags & ~RECORD_FLAGS_KNOWN:
        raise _RecordError(f"unknown record flags {flags:#x}")
    if time_ms > INT64_MAX:
        raise _RecordError(f"publish time {time_ms} exceeds int64")
    pos = RECORD_FIXED_BYTES
    key: bytes | None = None
    if flags & RECORD_FLAG_KEY:
        key_len, pos = _length(r, pos, _U32)
        key, pos = _span(r, pos, key_len)
    attributes: list[tuple[bytes, bytes]] = []
    if flags & RECORD_FLAG_ATTRIBUTES:
        count, pos = _length(r, pos, _U16)
        if count == 0:
            raise _RecordError("attributes flag set with zero attributes")
        names: set[bytes] = set()
        for i in range(count):
            name_len, pos = _length(r, pos, _U16)
            name, pos = _span(r, pos, name_len)
            value_len, pos = _length(r, pos, _U32)
            value, pos = _span(r, pos, value_len)
            try:
                name.decode("utf-8")
                value.decode("utf-8")
            except UnicodeDecodeError:
                raise _RecordError(f"attribute {i} is not valid UTF-8") from None
            if name in names:
                raise _RecordError(f"attribute {i} repeats a name")
            names.add(name)
            attributes.append((name, value))
    return time_ms, key, attributes, bytes(r[pos:])


def _length(r: memoryview, pos: int, width: int) -> tuple[int, int]:
    if width > len(r) - pos:
        raise _RecordError(f"record truncated at field position {pos}")
    return int.from_bytes(r[pos:pos + width], "little"), pos + width


def _span(r: memoryview, pos: int, length: int) -> tuple[bytes, int]:
    if length > len(r) - pos:
        raise _RecordError(f"record truncated at field position {pos}")
    return bytes(r[pos:pos + length]), pos + length


def _build(kept: list[_Row], limit: int, frame_count: int, first: int | None,
           last: int | None) -> Columns:
    keys = [k for _, _, k, _, _ in kept]
    payloads = [p for *_, p in kept]
    entries = [e for _, _, _, attrs, _ in kept for e in attrs]
    key_data = b"".join(k for k in keys if k is not None)
    payload_data = b"".join(payloads)
    names_data = b"".join(name for name, _ in entries)
    values_data = b"".join(value for _, value in entries)
    for buffer, data in (("key_data", key_data), ("payload_data", payload_data),
                         ("attribute_names_data", names_data),
                         ("attribute_values_data", values_data)):
        if len(data) > limit:
            raise ColumnsTooLarge(buffer, len(data), limit)
    validity = bytearray((len(kept) + 7) // 8)
    for i, k in enumerate(keys):
        if k is not None:
            validity[i >> 3] |= 1 << (i & 7)
    return Columns(
        count=len(kept),
        offsets=_int64s(o for o, *_ in kept),
        publish_times_ms=_int64s(t for _, t, *_ in kept),
        key_validity=bytes(validity),
        key_null_count=sum(k is None for k in keys),
        key_offsets=_running(0 if k is None else len(k) for k in keys),
        key_data=key_data,
        payload_offsets=_running(len(p) for p in payloads),
        payload_data=payload_data,
        attribute_count=len(entries),
        attribute_offsets=_running(len(attrs) for _, _, _, attrs, _ in kept),
        attribute_names_offsets=_running(len(name) for name, _ in entries),
        attribute_names_data=names_data,
        attribute_values_offsets=_running(len(value) for _, value in entries),
        attribute_values_data=values_data,
        frame_count=frame_count,
        first_frame_offset=first,
        last_frame_offset=last,
    )


def _int64s(values: Iterable[int]) -> bytes:
    a = array("q", values)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def _running(lengths: Iterable[int]) -> bytes:
    """int32 offsets from 0: one more than there are lengths."""
    a = array("i", [0])
    total = 0
    for n in lengths:
        total += n
        a.append(total)
    if _SWAP:
        a.byteswap()
    return a.tobytes()
