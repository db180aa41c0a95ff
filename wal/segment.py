"""Segment files: create, validate, and find the torn tail (format: ``native/format.py``)."""
from __future__ import annotations

import bisect
import os
import re
import struct
import time
from dataclasses import dataclass, field

from native import crc32c, decode_segment_header, encode_segment_header, scan_frames
from native.errors import CorruptSegmentHeader
from native.format import (
    FRAME_HEADER_BYTES,
    MAX_RECORD_BYTES,
    SEGMENT_HEADER_BYTES,
    STOP_BAD_LENGTH,
    STOP_CRC,
    STOP_TORN,
    segment_file_name,
)
from wal.errors import CorruptLog
from wal.fs import FileSystem

_NAME_RE = re.compile(r"(\d{20})\.seg")
_TEMP_SUFFIX = ".tmp"
_U32 = struct.Struct("<I")
# Stop reasons a torn write can produce. A frame with a valid CRC but the wrong offset
# (``offset``) or an unparsable record was written whole, so it is never a torn write.
_TEAR_REASONS = frozenset({STOP_TORN, STOP_BAD_LENGTH, STOP_CRC})


@dataclass
class Segment:
    """One segment file as the WAL knows it. Sizes and offsets cover durable data only."""

    base_offset: int
    path: str
    created_ms: int
    last_offset: int  # base_offset - 1 while empty
    size_bytes: int  # position just past the last durable frame
    sealed: bool = False
    # Sparse (offset, position) pairs, ascending: where a scan for an offset may start.
    index_offsets: list = field(default_factory=list)
    index_positions: list = field(default_factory=list)

    @property
    def record_count(self) -> int:
        return self.last_offset - self.base_offset + 1

    def add_index(self, offset: int, position: int, interval_bytes: int) -> None:
        if self.index_positions and position - self.index_positions[-1] < interval_bytes:
            return
        assert not self.index_offsets or offset > self.index_offsets[-1]
        self.index_offsets.append(offset)
        self.index_positions.append(position)

    def seek(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last indexed frame at or before ``offset``."""
        at = bisect.bisect_right(self.index_offsets, offset) - 1
        if at < 0:
            return self.base_offset, SEGMENT_HEADER_BYTES
        return self.index_offsets[at], self.index_positions[at]


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """Public, immutable view of a segment (for the uploader and operators)."""

    base_offset: int
    last_offset: int  # base_offset - 1 while empty
    path: str
    size_bytes: int
    created_ms: int
    sealed: bool


@dataclass
class ScannedSegment:
    segment: Segment
    truncate_to: int | None  # a torn tail to cut, or None when the file is clean
    file_bytes: int


def parse_segment_name(name: str) -> int | None:
    match = _NAME_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def is_temp_name(name: str) -> bool:
    return name.endswith(_TEMP_SUFFIX)


def create_segment(fs: FileSystem, directory: str, base_offset: int) -> Segment:
    """Creates a segment whose header is durable before its name appears.

    Writing the header to a temp name and renaming means a ``.seg`` file always has a
    whole header, so an invalid header is corruption, never a half-finished create.
    """
    created_ms = time.time_ns() // 1_000_000
    path = os.path.join(directory, segment_file_name(base_offset))
    temp = path + _TEMP_SUFFIX
    if fs.exists(temp):
        fs.remove(temp)
    handle = fs.open_append(temp)
    try:
        handle.write([encode_segment_header(base_offset, created_ms)])
        handle.sync()
    finally:
        handle.close()
    fs.rename(temp, path)
    fs.fsync_dir(directory)
    return Segment(base_offset, path, created_ms, base_offset - 1, SEGMENT_HEADER_BYTES)


def scan_segment(fs: FileSystem, path: str, base_offset: int, is_last: bool,
                 index_interval_bytes: int) -> ScannedSegment:
    """Validates one segment file; raises CorruptLog unless it is clean or has a torn tail."""
    data = fs.read_all(path)
    try:
        header_base, created_ms = decode_segment_header(data)
    except CorruptSegmentHeader as exc:
        raise CorruptLog(path, 0, f"segment header: {exc}") from exc
    if header_base != base_offset:
        raise CorruptLog(path, 8, f"header base offset {header_base} != file name's {base_offset}")
    result = scan_frames(data, pos=SEGMENT_HEADER_BYTES, expected_offset=base_offset,
                         decode=False, positions=True)
    segment = Segment(base_offset, path, created_ms, base_offset - 1, result.end)
    if result.count:
        assert result.first_offset == base_offset and result.last_offset == base_offset + result.count - 1
        segment.last_offset = result.last_offset
    for index, position in enumerate(result.positions):
        segment.add_index(base_offset + index, position, index_interval_bytes)
    truncate_to = None
    if result.error is not None:
        _check_tear(data, path, result.error, is_last)
        truncate_to = result.end
    return ScannedSegment(segment, truncate_to, len(data))


def _check_tear(data: bytes, path: str, stop, is_last: bool) -> None:
    """A stop is a repairable torn tail only at the end of the last segment."""
    detail = f"{stop.reason}: {stop.detail}"
    if not is_last:
        raise CorruptLog(path, stop.position, f"invalid frame in a sealed segment ({detail})")
    if stop.reason not in _TEAR_REASONS:
        raise CorruptLog(path, stop.position, f"whole frame out of place ({detail})")
    follower = find_valid_frame_after(data, stop.position + 1)
    if follower is not None:
        raise CorruptLog(path, stop.position,
                         f"invalid frame followed by a valid frame at byte {follower} ({detail})")


def find_valid_frame_after(data: bytes, start: int) -> int | None:
    """Position of the first CRC-valid frame at or after ``start``, else None.

    This is what separates a torn tail (garbage to the end) from corruption in the middle
    (garbage, then real frames). It tries every byte position, but the length test rejects
    almost all of them before any CRC is computed.
    """
    view = memoryview(data)
    size = len(data)
    unpack = _U32.unpack_from
    for position in range(start, size - FRAME_HEADER_BYTES):
        length = unpack(view, position + 4)[0]
        if length == 0 or length > MAX_RECORD_BYTES or position + FRAME_HEADER_BYTES + length > size:
            continue
        if crc32c(view[position + 4:position + FRAME_HEADER_BYTES + length]) == unpack(view, position)[0]:
            return position
    return None
