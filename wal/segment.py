"""Segment files: create, validate, and find the torn tail (format: ``native/format.py``)."""
from __future__ import annotations

import bisect
import os
import re
import secrets
import struct
import time
from dataclasses import dataclass, field

from native import crc32c, decode_segment_header, encode_round_marker, encode_segment_header, scan_frames
from native.errors import CorruptSegmentHeader
from native.format import (
    FRAME_HEADER_BYTES,
    MAX_OFFSET,
    MAX_RECORD_BYTES,
    ROUND_MARKER,
    ROUND_MARKER_BYTES,
    ROUND_MARKER_TAG,
    SEGMENT_HEADER_BYTES,
    SEGMENT_VERSION,
    SEGMENT_VERSION_ROUNDS,
    STOP_BAD_LENGTH,
    STOP_CRC,
    STOP_TORN,
    ScanStop,
    segment_file_name,
    segment_marker_key,
    segment_version,
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
    # Format version of the file (native/format.py): 2 and up hold commit-round markers.
    version: int = SEGMENT_VERSION
    # What its round markers' CRC covers (version 3, from its header); None before version 3.
    marker_key: int | None = None
    # Sparse (offset, position) pairs, ascending: where a scan for an offset may start.
    index_offsets: list[int] = field(default_factory=list)
    index_positions: list[int] = field(default_factory=list)

    @property
    def record_count(self) -> int:
        return self.last_offset - self.base_offset + 1

    @property
    def has_rounds(self) -> bool:
        """Whether the file's frames are grouped in commit rounds behind round markers."""
        return self.version >= SEGMENT_VERSION_ROUNDS

    def add_index(self, offset: int, position: int, interval_bytes: int) -> None:
        if self.index_positions and position - self.index_positions[-1] < interval_bytes:
            return
        assert not self.index_offsets or offset > self.index_offsets[-1]
        self.index_offsets.append(offset)
        self.index_positions.append(position)

    def learn_index(self, offset: int, position: int, interval_bytes: int) -> None:
        """Index a frame a read found (``offset`` starts at byte ``position``), unless an
        indexed frame is within ``interval_bytes`` of it on either side.

        Rounds written by this process are indexed at their first frame only
        (``add_index``: the writer knows no other frame's position), so one big round has
        one index point, and a reader catching up through it would scan again from that
        point on every read: quadratic in the round's size. Reads index what they found
        instead, so the next read starts next to where the last one stopped. Bounded as
        ``add_index`` is: points are at least ``interval_bytes`` apart. Precondition, so
        a seek never lands off a frame: ``position`` is where a validated scan found the
        frame ``offset``, in durable data (which is never rewritten while the segment
        exists: only a failed, never durable round is ever cut off a segment's end)."""
        offsets, positions = self.index_offsets, self.index_positions
        at = bisect.bisect_right(offsets, offset)
        if at and offsets[at - 1] == offset:
            return
        if position - (positions[at - 1] if at else SEGMENT_HEADER_BYTES) < interval_bytes:
            return
        if at < len(positions) and positions[at] - position < interval_bytes:
            return
        assert (not at or positions[at - 1] < position) and (at == len(positions) or position < positions[at])
        offsets.insert(at, offset)
        positions.insert(at, position)

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
    # Random, so no message can hold a marker valid in this segment (native/format.py,
    # "Commit rounds": a forged one made recovery refuse a torn tail, atk91 F1).
    marker_key = secrets.randbits(32)
    path = os.path.join(directory, segment_file_name(base_offset))
    temp = path + _TEMP_SUFFIX
    if fs.exists(temp):
        fs.remove(temp)
    handle = fs.open_append(temp)
    try:
        handle.write([encode_segment_header(base_offset, created_ms, SEGMENT_VERSION, marker_key)])
        handle.sync()
    finally:
        handle.close()
    fs.rename(temp, path)
    fs.fsync_dir(directory)
    return Segment(base_offset, path, created_ms, base_offset - 1, SEGMENT_HEADER_BYTES,
                   version=SEGMENT_VERSION, marker_key=marker_key)


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
    version = segment_version(data)
    rounds = version >= SEGMENT_VERSION_ROUNDS
    marker_key = segment_marker_key(data)
    result = scan_frames(data, pos=SEGMENT_HEADER_BYTES, expected_offset=base_offset,
                         decode=False, positions=True, rounds=rounds, marker_key=marker_key)
    segment = Segment(base_offset, path, created_ms, base_offset - 1, result.end, version=version,
                      marker_key=marker_key)
    if result.count:
        assert result.first_offset == base_offset and result.last_offset == base_offset + result.count - 1
        segment.last_offset = result.last_offset
    for index, position in enumerate(result.positions):
        segment.add_index(base_offset + index, position, index_interval_bytes)
    truncate_to = None
    if result.error is not None:
        expected = result.last_offset + 1 if result.count else base_offset
        _check_tear(data, path, result.error, is_last, rounds, expected, marker_key)
        truncate_to = result.end
    return ScannedSegment(segment, truncate_to, len(data))


def _check_tear(data: bytes, path: str, stop: ScanStop, is_last: bool, rounds: bool = False,
                expected_offset: int | None = None, marker_key: int | None = None) -> None:
    """A stop is a repairable torn tail only in the last round of the last segment.

    With commit rounds (format version 2) the proof that damaged data had been synced is a
    valid round marker of a LATER round after it: that round was written only after the
    damaged one's fdatasync returned. Without one, the damage lies in the last round, which
    a power loss may have persisted in any page order (a later page kept, an earlier one
    lost), so valid-looking frames after the damage are that round's unsynced tail, not
    evidence. Version 1 segments have no markers: any CRC-valid frame after the damage is
    treated as synced data (the stricter old rule). Version 3 markers count only with the
    segment's ``marker_key``, so a message holding a marker is no evidence (version 2 has no
    key: there a forged marker still counts, until the WAL cuts a version 3 segment).
    """
    detail = f"{stop.reason}: {stop.detail}"
    if not is_last:
        raise CorruptLog(path, stop.position, f"invalid frame in a sealed segment ({detail})")
    if stop.reason not in _TEAR_REASONS:
        raise CorruptLog(path, stop.position, f"whole frame out of place ({detail})")
    if rounds:
        assert expected_offset is not None, "a round-aware tear check needs the expected offset"
        later = find_later_round_marker(data, stop.position + 1, expected_offset, marker_key)
        if later is not None:
            raise CorruptLog(path, stop.position,
                             f"invalid data followed by the marker of a later commit round at byte {later}, "
                             f"so it had been synced ({detail})")
        return
    follower = find_valid_frame_after(data, stop.position + 1)
    if follower is not None:
        raise CorruptLog(path, stop.position,
                         f"invalid frame followed by a valid frame at byte {follower} ({detail})")


_TAG_BYTES = _U32.pack(ROUND_MARKER_TAG)


def find_later_round_marker(data: bytes, start: int, expected_offset: int,
                            marker_key: int | None = None) -> int | None:
    """Position of the first CRC-valid round marker at or after ``start`` whose first offset
    is above ``expected_offset`` (so it starts a round after the one being scanned), else None.
    ``marker_key``: the segment's (version 3), which a valid marker's CRC covers.

    Markers are found by their tag with ``bytes.find``, so the search costs one C scan of the
    tail plus one 12-byte CRC per candidate.
    """
    view = memoryview(data)
    size = len(data)
    at = data.find(_TAG_BYTES, start + 4)
    while at != -1:
        position = at - 4
        if position + ROUND_MARKER_BYTES > size:
            return None
        offset = ROUND_MARKER.unpack_from(view, position)[2]
        if (expected_offset < offset <= MAX_OFFSET
                and view[position:position + ROUND_MARKER_BYTES] == encode_round_marker(offset, marker_key)):
            return position
        at = data.find(_TAG_BYTES, at + 1)
    return None


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
