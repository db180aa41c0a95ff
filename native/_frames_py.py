"""Pure-Python twin of ``native/_frames.pyx``: CRC32C, records, frames, frame scanning,
segment headers and round markers; the reference implementation of ``native/format.py``.

It must produce identical bytes, results and errors to the Cython twin. It is slow on
purpose-free grounds (one Python call per field); use it to read the format, and to run
anywhere the extension cannot be built. ``native/_append_py.py`` and
``native/_objects_py.py`` build on the helpers marked as shared below, as their compiled
twins build on the C declarations in ``native/_frames.pxd``.
"""
from __future__ import annotations

import errno
import operator
import os
import struct
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import crc32c as _crc32c_mod

if TYPE_CHECKING:
    from native._protocols import Message
    from native.format import Buffer

from native.errors import CodecError, CorruptSegmentHeader
from native.format import (
    FRAME_HEADER,
    FRAME_HEADER_BYTES,
    MAX_RECORD_BYTES,
    RECORD_FIXED,
    RECORD_FIXED_BYTES,
    RECORD_FLAG_ATTRIBUTES,
    RECORD_FLAG_KEY,
    RECORD_FLAGS_KNOWN,
    RECORD_VERSION,
    ROUND_MARKER,
    ROUND_MARKER_BYTES,
    ROUND_MARKER_TAG,
    SEGMENT_HEADER,
    SEGMENT_HEADER_BYTES,
    SEGMENT_MAGIC,
    SEGMENT_VERSION,
    SEGMENT_VERSION_KEYED,
    SEGMENT_VERSIONS_READABLE,
    STOP_BAD_LENGTH,
    STOP_CRC,
    STOP_OFFSET,
    STOP_RECORD,
    STOP_TORN,
    Record,
    ScanResult,
    ScanStop,
)

IMPLEMENTATION = "python"
# Whether the ``crc32c`` package computes with CPU instructions (the compiled twin reports its
# own C implementation under the same name).
CRC32C_HARDWARE: bool = bool(_crc32c_mod.hardware_based)

__all__ = [
    "CRC32C_HARDWARE", "crc32c", "encode_record", "encode_frame", "encode_batch",
    "decode_record", "scan_frames", "encode_round_marker", "encode_segment_header",
    "decode_segment_header", "write_rounds",
]

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF


def crc32c(data: Buffer, value: int = 0) -> int:
    """CRC32C of ``data``, continuing from ``value``."""
    result: int = _crc32c_mod.crc32c(data, value)
    return result


def as_u64(value: object, what: str) -> int:
    """The value as a u64; anything else (bool aside, which is an int) is a CodecError.
    Shared with the other pure-Python twins."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]  # TypeError is the check
    except TypeError as exc:
        raise CodecError(f"{what} must be an int, not {type(value).__name__}") from exc
    if not 0 <= number <= _U64_MAX:
        raise CodecError(f"{what} {number} is not a u64")
    return number


def _as_u32(value: object, what: str) -> int:
    """The value as a u32, else a CodecError (the messages of the compiled twin's ``_u32``)."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]  # TypeError is the check
    except TypeError as exc:
        raise CodecError(f"{what} must be an int, not {type(value).__name__}") from exc
    if not 0 <= number <= 0xFFFFFFFF:
        raise CodecError(f"{what} {number} is not a u32")
    return number


def _marker_crc(body: Buffer, marker_key: int | None) -> int:
    """The CRC of a round marker whose bytes [4, 16) are ``body``: over them, then (version 3)
    over the segment's marker key, little-endian (native/format.py, "Commit rounds")."""
    crc = crc32c(body)
    return crc if marker_key is None else crc32c(_U32.pack(marker_key), crc)


def _as_bytes(value: object, what: str) -> bytes:
    """A bytes-like value as bytes. ``bytes(5)`` would silently give five zero bytes, so ints
    (and str, which has no single byte encoding here) are refused rather than converted."""
    if type(value) is bytes:
        return value
    try:
        return bytes(memoryview(value))  # type: ignore[arg-type]  # TypeError is the check
    except TypeError as exc:
        raise CodecError(f"{what} must be bytes-like, not {type(value).__name__}") from exc


def _utf8(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise CodecError("attribute names and values must be str")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CodecError(f"attribute {what} is not encodable as UTF-8") from exc


def encode_record(publish_time: int, key: bytes | None, attributes: Mapping[str, str] | None,
                  payload: bytes) -> bytes:
    publish_time = as_u64(publish_time, "publish_time")
    flags = 0
    parts = [b""]
    if key is not None:
        flags |= RECORD_FLAG_KEY
        key = _as_bytes(key, "key")
        if len(key) > _U32_MAX:
            raise CodecError("key longer than 4 GiB")
        parts.append(_U32.pack(len(key)))
        parts.append(key)
    if attributes is not None and not isinstance(attributes, Mapping):
        raise CodecError(f"attributes must be a mapping of str to str, not {type(attributes).__name__}")
    if attributes:
        flags |= RECORD_FLAG_ATTRIBUTES
        if len(attributes) > _U16_MAX:
            raise CodecError(f"{len(attributes)} attributes (max {_U16_MAX})")
        parts.append(_U16.pack(len(attributes)))
        for name, value in attributes.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise CodecError("attribute names and values must be str")
            name_b = _utf8(name, "name")
            value_b = _utf8(value, "value")
            if len(name_b) > _U16_MAX:
                raise CodecError(f"attribute name of {len(name_b)} bytes (max {_U16_MAX})")
            parts.append(_U16.pack(len(name_b)))
            parts.append(name_b)
            parts.append(_U32.pack(len(value_b)))
            parts.append(value_b)
    parts[0] = RECORD_FIXED.pack(RECORD_VERSION, flags, publish_time)
    parts.append(_as_bytes(payload, "payload"))
    return b"".join(parts)


def frame_record(offset: int, record: bytes) -> bytes:
    """The frame (header + CRC) around an encoded record."""
    offset = as_u64(offset, "offset")
    if len(record) > MAX_RECORD_BYTES:
        raise CodecError(f"record of {len(record)} bytes exceeds the format limit {MAX_RECORD_BYTES}")
    body = _U32.pack(len(record)) + _U64.pack(offset) + record
    return _U32.pack(crc32c(body)) + body


def encode_frame(offset: int, publish_time: int, key: bytes | None,
                 attributes: Mapping[str, str] | None, payload: bytes) -> bytes:
    """One frame (header + record) for one message."""
    return frame_record(offset, encode_record(publish_time, key, attributes, payload))


def encode_batch(first_offset: int, messages: Iterable[Message]) -> bytes:
    """Frames for ``(publish_time, key, attributes, payload)`` tuples at first_offset, +1, …"""
    first_offset = as_u64(first_offset, "first_offset")
    out = []
    for index, message in enumerate(list(messages)):  # a snapshot, as the compiled twin takes
        if not isinstance(message, (tuple, list)) or len(message) != 4:
            raise CodecError("each message must be a (publish_time, key, attributes, payload) tuple")
        publish_time, key, attributes, payload = message
        out.append(encode_frame(first_offset + index, publish_time, key, attributes, payload))
    return b"".join(out)


def decode_record(offset: int, record_buffer: Buffer) -> Record:
    """Parse one record body; raises CodecError when it is malformed."""
    record = memoryview(record_buffer)
    size = len(record)
    if size < RECORD_FIXED_BYTES:
        raise CodecError(f"record of {size} bytes is shorter than its fixed part")
    version, flags, publish_time = RECORD_FIXED.unpack_from(record, 0)
    if version != RECORD_VERSION:
        raise CodecError(f"unsupported record version {version}")
    if flags & ~RECORD_FLAGS_KNOWN:
        raise CodecError(f"unknown record flags {flags:#x}")
    pos = RECORD_FIXED_BYTES
    key = None
    if flags & RECORD_FLAG_KEY:
        key_len, pos = _read_len(record, pos, _U32)
        key, pos = _take(record, pos, key_len), pos + key_len
    attributes: dict[str, str] = {}
    if flags & RECORD_FLAG_ATTRIBUTES:
        count, pos = _read_len(record, pos, _U16)
        if count == 0:
            raise CodecError("attributes flag set with zero attributes")
        for _ in range(count):
            name_len, pos = _read_len(record, pos, _U16)
            name, pos = _take(record, pos, name_len), pos + name_len
            value_len, pos = _read_len(record, pos, _U32)
            value, pos = _take(record, pos, value_len), pos + value_len
            try:
                attributes[name.decode("utf-8")] = value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CodecError("attribute is not valid UTF-8") from exc
    return Record(offset, publish_time, key, attributes, bytes(record[pos:]))


def _read_len(buf: memoryview, pos: int, fmt: struct.Struct) -> tuple[int, int]:
    if pos + fmt.size > len(buf):
        raise CodecError(f"record truncated at field position {pos}")
    length: int = fmt.unpack_from(buf, pos)[0]
    return length, pos + fmt.size


def _take(buf: memoryview, pos: int, length: int) -> bytes:
    if pos + length > len(buf):
        raise CodecError(f"record truncated at field position {pos}")
    return bytes(buf[pos:pos + length])


def scan_frames(buf: Buffer, pos: int = 0, end: int | None = None, expected_offset: int | None = None,
                decode: bool = True, positions: bool = False,
                max_frames: int | None = None, rounds: bool = False, marker_key: int | None = None) -> ScanResult:
    """Validate frames in ``buf[pos:end]``; stop at the first invalid one (see format.py).

    ``rounds``: the buffer is segment data of version 2 or 3, where round markers may stand
    between frames; they are checked and skipped (and listed in ``markers`` with
    ``positions``). ``marker_key``: the segment's marker key (version 3), which their CRC
    covers; None for version 2."""
    if marker_key is not None:
        marker_key = _as_u32(marker_key, "marker_key")
    view = memoryview(buf).cast("B")
    if pos < 0 or (end is not None and end < 0):
        raise CodecError(f"scan window [{pos}, {end}) is negative")
    if expected_offset is not None:
        expected_offset = as_u64(expected_offset, "expected_offset")
    if max_frames is not None and max_frames < 0:
        raise CodecError(f"max_frames {max_frames} is negative")
    end = len(view) if end is None else min(end, len(view))
    records: list[Record] = []
    starts: list[int] = []
    markers: list[int] = []
    count = 0
    first = last = -1
    error = None
    while pos < end and (max_frames is None or count < max_frames):
        if rounds and end - pos >= ROUND_MARKER_BYTES and _U32.unpack_from(view, pos + 4)[0] == ROUND_MARKER_TAG:
            stop = _check_marker(view, pos, expected_offset, marker_key)
            if isinstance(stop, ScanStop):
                error = stop
                break
            if positions:
                markers.append(pos)
            expected_offset = stop
            pos += ROUND_MARKER_BYTES
            continue
        frame = _check_frame(view, pos, end, expected_offset)
        if isinstance(frame, ScanStop):
            error = frame
            break
        offset, length = frame
        body_start = pos + FRAME_HEADER_BYTES
        if decode:
            try:
                records.append(decode_record(offset, view[body_start:body_start + length]))
            except CodecError as exc:
                error = ScanStop(pos, STOP_RECORD, str(exc))
                break
        if positions:
            starts.append(pos)
        if count == 0:
            first = offset
        last = offset
        count += 1
        expected_offset = offset + 1
        pos = body_start + length
    return ScanResult(records, starts, count, first, last, pos, error, markers)


def _check_marker(view: memoryview, pos: int, expected_offset: int | None, marker_key: int | None) -> int | ScanStop:
    """Returns the first offset of a valid round marker at pos (whole, tag checked), else the ScanStop."""
    crc, _tag, offset = ROUND_MARKER.unpack_from(view, pos)
    if _marker_crc(view[pos + 4:pos + ROUND_MARKER_BYTES], marker_key) != crc:
        return ScanStop(pos, STOP_CRC, f"CRC mismatch in round marker claiming offset {offset}")
    if expected_offset is not None and offset != expected_offset:
        return ScanStop(pos, STOP_OFFSET, f"round marker offset {offset}, expected {expected_offset}")
    first_offset: int = offset
    return first_offset


def _check_frame(view: memoryview, pos: int, end: int, expected_offset: int | None) -> tuple[int, int] | ScanStop:
    """Returns (offset, length) of a valid frame at pos, else the ScanStop."""
    if end - pos < FRAME_HEADER_BYTES:
        return ScanStop(pos, STOP_TORN, f"{end - pos} bytes left, frame header needs {FRAME_HEADER_BYTES}")
    crc, length, offset = FRAME_HEADER.unpack_from(view, pos)
    if length == 0 or length > MAX_RECORD_BYTES:
        return ScanStop(pos, STOP_BAD_LENGTH, f"record length {length}")
    if end - pos - FRAME_HEADER_BYTES < length:
        return ScanStop(pos, STOP_TORN, f"record of {length} bytes, {end - pos - FRAME_HEADER_BYTES} left")
    if crc32c(view[pos + 4:pos + FRAME_HEADER_BYTES + length]) != crc:
        return ScanStop(pos, STOP_CRC, f"CRC mismatch in frame claiming offset {offset}")
    if expected_offset is not None and offset != expected_offset:
        return ScanStop(pos, STOP_OFFSET, f"offset {offset}, expected {expected_offset}")
    return offset, length


def encode_round_marker(first_offset: int, marker_key: int | None = None) -> bytes:
    """The 16-byte marker that starts a commit round: keyed with the segment's
    ``marker_key`` (format version 3), or without a key when None (version 2)."""
    first_offset = as_u64(first_offset, "first_offset")
    if marker_key is not None:
        marker_key = _as_u32(marker_key, "marker_key")
    body = ROUND_MARKER.pack(0, ROUND_MARKER_TAG, first_offset)[4:]
    return _U32.pack(_marker_crc(body, marker_key)) + body


def encode_segment_header(base_offset: int, created_ms: int, version: int = SEGMENT_VERSION,
                          marker_key: int = 0) -> bytes:
    """A segment header; ``marker_key`` (a u32) only in version 3, else it must be 0."""
    base_offset = as_u64(base_offset, "base_offset")
    created_ms = as_u64(created_ms, "created_ms")
    marker_key = _as_u32(marker_key, "marker_key")
    if version not in SEGMENT_VERSIONS_READABLE:
        raise CodecError(f"segment format version {version} is not one of {SEGMENT_VERSIONS_READABLE}")
    if marker_key and version < SEGMENT_VERSION_KEYED:
        raise CodecError(f"segment format version {version} has no marker key")
    head = SEGMENT_HEADER.pack(SEGMENT_MAGIC, version, 0, base_offset, created_ms, marker_key, 0)[:28]
    return head + _U32.pack(crc32c(head))


def decode_segment_header(buf: Buffer) -> tuple[int, int]:
    """Returns ``(base_offset, created_ms)``; raises CorruptSegmentHeader. Any readable
    version is accepted; ``native.format.segment_version`` says which one it is."""
    view = memoryview(buf).cast("B")
    if len(view) < SEGMENT_HEADER_BYTES:
        raise CorruptSegmentHeader(f"segment header truncated: {len(view)} of {SEGMENT_HEADER_BYTES} bytes")
    magic, version, flags, base, created_ms, _reserved, crc = SEGMENT_HEADER.unpack_from(view, 0)
    if magic != SEGMENT_MAGIC:
        raise CorruptSegmentHeader(f"bad segment magic {bytes(magic)!r}")
    if crc32c(view[:28]) != crc:
        raise CorruptSegmentHeader("segment header CRC mismatch")
    if version not in SEGMENT_VERSIONS_READABLE:
        raise CorruptSegmentHeader(f"unsupported segment format version {version}")
    if flags != 0:
        raise CorruptSegmentHeader(f"unknown segment flags {flags:#x}")
    return base, created_ms


# ---------------------------------------------------------------------------------------------
# Writing the rounds of many files

def write_rounds(fds: list[int], rounds: list[list[bytes]]) -> list[int]:
    """Write ``rounds[i]`` (bytes objects, in order) to descriptor ``fds[i]``, for every i,
    with vectored writes until every byte is out; returns one errno per file (0: written
    whole). One failing file does not stop the others. The compiled twin does all of it in
    ONE release of the GIL: a commit group writing 1,000 topics' rounds would otherwise
    give the GIL away and wait to take it back 1,000 times per round."""
    if len(fds) != len(rounds):
        raise ValueError("write_rounds needs one list of parts per descriptor")
    for parts in rounds:
        if type(parts) is not list or any(type(p) is not bytes for p in parts):
            raise TypeError("write_rounds takes lists of bytes")
    results = []
    for fd, parts in zip(fds, rounds):
        results.append(_writev_whole(fd, parts))
    return results


def _writev_whole(fd: int, parts: list[bytes]) -> int:
    """errno of writing ``parts`` whole to ``fd`` (short writes and EINTR continue), or 0."""
    pending: list[bytes | memoryview] = [p for p in parts if p]
    while pending:
        try:
            written = os.writev(fd, pending[:_IOV_MAX])
        except InterruptedError:
            continue
        except OSError as exc:
            return exc.errno or errno.EIO
        if written <= 0:
            return errno.EIO
        while written:
            head = pending[0]
            if written >= len(head):
                written -= len(head)
                pending.pop(0)
            else:
                pending[0] = memoryview(head)[written:]
                written = 0
    return 0


_IOV_MAX = 1024  # writev's vector limit on Linux (sysconf(_SC_IOV_MAX))
