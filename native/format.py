"""The WAL on-disk format. This docstring is the specification; everything else refers to it.

All integers are little-endian. CRC32C is the Castagnoli polynomial (0x1EDC6F41, reflected
0x82F63B78), initial value 0, final xor 0xFFFFFFFF — i.e. ``crc32c.crc32c(b"123456789") ==
0xE3069283``.

Segment files
=============
A topic's WAL is a directory of segment files named ``<base offset, 20 digits>.seg``; the
name carries the offset of the first frame the segment may hold. A segment starts with a
32-byte header::

    0   4  magic            b"DNBW"
    4   2  format version   1
    6   2  flags            0 (readers reject unknown flags)
    8   8  base offset      u64, equal to the file name's offset
    16  8  created_ms       u64, wall clock at creation (ms since the epoch)
    24  4  reserved         0
    28  4  header CRC32C    over bytes [0, 28)

and is followed by frames, back to back, no padding. A segment is cut (and the next one
started) when it passes ``segment_bytes_max`` or ``segment_age_max_s``; everything buffered
is written and fsynced into the old segment before the new one is created, so the new
segment's base offset is exactly the old segment's last offset + 1.

Frames
======
::

    0   4  CRC32C           over bytes [4, 16 + L): the length, the offset and the record
    4   4  L                record length in bytes, 1 <= L <= MAX_RECORD_BYTES
    8   8  offset           u64
    16  L  record

Offsets in a segment are contiguous: frame *i* holds ``base offset + i``. A reader stops at
the first frame that is incomplete (``torn``), has an impossible length (``bad_length``, which
includes the zeros of a pre-allocated or never-written tail), fails its CRC (``crc``), carries
an unexpected offset (``offset``) or holds a record it cannot parse (``record``), and reports
the byte position where that frame starts. Recovery truncates a torn tail of the *last*
segment back to the last valid frame; anything invalid that is followed by valid data is
corruption in the middle of the log and is refused.

The dnb1 archive objects (see ``native/object_format.py``) carry these same frames verbatim,
so archiving copies bytes rather than re-encoding records.

Records (version 1)
===================
::

    0   1  record version   1 (a reader rejects versions it does not know)
    1   1  flags            bit 0: key present; bit 1: attributes present; other bits 0
    2   8  publish_time     u64, milliseconds since the epoch
    [key present]
        4  K                key length
        K  key bytes
    [attributes present]
        2  N                number of attributes, N >= 1
        N times:
          2  KL  key length,   KL bytes of UTF-8
          4  VL  value length, VL bytes of UTF-8
    rest   payload          (its length is implied by L)

Attributes are written in the mapping's iteration order, so both codec twins produce
identical bytes for the same input. A key of ``b""`` is present-and-empty, distinct from no
key. New fields go behind new flag bits in a new record version; old records keep decoding.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

SEGMENT_MAGIC = b"DNBW"
SEGMENT_VERSION = 1
SEGMENT_HEADER = struct.Struct("<4sHHQQII")
SEGMENT_HEADER_BYTES = SEGMENT_HEADER.size  # 32
SEGMENT_SUFFIX = ".seg"

FRAME_HEADER = struct.Struct("<IIQ")
FRAME_HEADER_BYTES = FRAME_HEADER.size  # 16
# A hard limit of the format, far above any configured max_message_bytes; a length
# beyond it can only be garbage (a torn or corrupt frame), never a real record.
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: The largest offset a topic may ever assign: 2**63 - 1, what a signed 64-bit integer
#: (Kafka's and Java's long, SQLite's INTEGER, etcd's int64 revisions) holds. Frames store
#: offsets as u64, but no layer accepts one above this: the WAL refuses to assign it
#: (``OffsetOverflow``), recovery and the metadata records refuse to read it.
MAX_OFFSET = (1 << 63) - 1

RECORD_VERSION = 1
RECORD_FLAG_KEY = 0x01
RECORD_FLAG_ATTRIBUTES = 0x02
RECORD_FLAGS_KNOWN = RECORD_FLAG_KEY | RECORD_FLAG_ATTRIBUTES
RECORD_FIXED = struct.Struct("<BBQ")  # version, flags, publish_time
RECORD_FIXED_BYTES = RECORD_FIXED.size  # 10

# Stable stop reasons reported by scan_frames.
STOP_TORN = "torn"
STOP_BAD_LENGTH = "bad_length"
STOP_CRC = "crc"
STOP_OFFSET = "offset"
STOP_RECORD = "record"


class Record(NamedTuple):
    """One message as stored: its offset and the fields the producer gave."""

    offset: int
    publish_time: int
    key: bytes | None
    attributes: dict[str, str]
    payload: bytes


class ScanStop(NamedTuple):
    """Why a scan stopped before the end of the buffer, and where the bad frame starts."""

    position: int
    reason: str
    detail: str


class ScanResult(NamedTuple):
    """What :func:`scan_frames` found.

    ``records`` holds decoded records when the scan decoded (else it is empty);
    ``positions`` holds each frame's start position when asked for (else it is empty).
    ``end`` is the byte position just past the last valid frame. ``error`` is None when
    the scan consumed the buffer up to its end exactly.
    """

    records: list
    positions: list
    count: int
    first_offset: int
    last_offset: int
    end: int
    error: ScanStop | None


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"
