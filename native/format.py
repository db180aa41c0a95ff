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
    4   2  format version   3 (1 and 2 are still read; see "Format versions")
    6   2  flags            0 (readers reject unknown flags)
    8   8  base offset      u64, equal to the file name's offset
    16  8  created_ms       u64, wall clock at creation (ms since the epoch)
    24  4  marker key       u32, random, drawn when the segment is created (version 2: 0)
    28  4  header CRC32C    over bytes [0, 28)

and is followed by commit rounds, back to back, no padding (version 1: by frames). A segment
is cut (and the next one started) when it passes ``segment_bytes_max`` or
``segment_age_max_s`` (each up to a tenth early, by an amount that differs from segment to
segment: ``wal.writer.SIZE_JITTER``, ``AGE_JITTER``); everything buffered is written and fsynced into the old segment before
the new one is created, so the new segment's base offset is exactly the old segment's last
offset + 1.

Commit rounds (versions 2 and 3)
================================
The writer makes data durable in rounds: one write of everything pending, one fdatasync, and
only then the next round. Each round is a 16-byte round marker followed by the round's frames
(at least one)::

    0   4  CRC32C           version 3: over bytes [4, 16), then the segment's marker key
                            (u32); version 2: over bytes [4, 16)
    4   4  tag              0xFFFFFFFF (a length no frame can have, so a marker is never a frame)
    8   8  first offset     u64, the offset of the frame that follows it

Why the key (version 3): recovery searches a damaged tail for a later round's marker at every
byte position, record payloads included (see "Recovery"). Without a key anyone who may produce
to the topic can put a valid marker inside a message; had a power loss then torn that
message's own round (never acknowledged), recovery would have taken the forged marker as
proof of synced data and refused to open the WAL (atk91 F1). The key is in the segment's
header on disk only; producers and readers never see it, so a marker in a payload is valid
for a given segment with probability 2**-32.

A marker is valid where a frame could start, and its first offset must be the offset the
next frame is expected to have. Readers skip markers; they are never part of what a reader,
an archive object or the cache holds (archives carry frames only, unchanged).

Why markers exist: round *k + 1* is written only after round *k*'s fdatasync returned, so a
valid marker of a later round proves that everything before it had been synced. That is
how recovery tells an unsynced tail, whose pages a power loss may persist in any order (a
later page kept, an earlier one lost), from corruption of synced data.

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
the byte position where that frame starts. The round markers of version 2 are checked the
same way (``crc``, ``offset``).

Recovery: only the last round of the *last* segment can be unsynced (rounds never span
segments). Where the scan of the last segment stops at a tear-like stop (``torn``,
``bad_length``, ``crc``), it searches the rest of the file for a CRC-valid round marker whose
first offset is above the offset expected at the stop (version 3: valid with the segment's
marker key; version 2 markers have no key, so a message holding one could be taken for it):

* none (versions 2 and 3): the damage lies in the last round, which may never have been synced;
  the file is truncated back to the last valid frame or marker before it, whatever the bytes
  after it look like (valid-looking frames of that round included);
* one: a later round had been written, so the damaged data had been synced: corruption,
  refused, nothing changed.

A ``offset`` or ``record`` stop is a whole frame out of place, never a tear, and anything
invalid in a sealed segment is corruption. Version 1 segments have no markers and keep the
stricter rule: an invalid frame followed by any CRC-valid frame is refused. Recovery also
refuses to truncate below the next offset the checkpoint recorded as durable.

The dnb1 archive objects (see ``native/object_format.py``) carry these same frames verbatim,
so archiving copies bytes rather than re-encoding records.

The checkpoint (``wal.ckpt``)
=============================
Each WAL directory holds one small checkpoint beside its segments (what it records and the
rules recovery checks against it: ``wal/checkpoint.py``). Its body is a JSON document;
``{"crc32c": C, "body": "<JSON>"}`` as the whole file is the first layout (and the journal's
checkpoint's, below in ``native/journal_format.py``), replaced with temp, fsync, rename,
fsync dir. A WAL writes the two-slot layout: exactly 8,192 bytes, two 4,096-byte slots::

    0   8  magic            b"DNBCKPT2"
    8   8  sequence         u64, one more than the other slot's at its write
    16  4  L                u32, body length (at most 4,072)
    20  4  CRC32C           over bytes 8..20 and the body
    24  L  body             the JSON document; zeros after it to the slot's end

The checkpoint is the valid slot with the higher sequence. A write goes in place into the
other slot (``pwrite``, ``fdatasync``), so a torn write leaves the slot before it. A write
may skip its ``fdatasync`` only while the slot it keeps is durable; the next write then
syncs the file before writing, so both slots are never unsynced at once. Creating
the file, or replacing one of the first layout, writes both slots, as the first layout is
written (so would a body over 4,072 bytes, which no WAL's state reaches, in the first
layout). A slot counts only if its CRC holds and its body is one this release reads
(its ``version``, whole-number offsets); else the other slot is the checkpoint. A release
from before this layout reads the file as unreadable, and opens the WAL without the
checkpoint's checks (the checkpoint is advisory; nothing is lost).

Format versions
===============
* 1: frames back to back, no round markers. Still opened and read; the WAL appends to a
  version 1 segment no more: it cuts a version 2 segment before its first write (an empty
  version 1 segment is replaced by an empty version 2 one).
* 2: commit rounds with round markers whose CRC has no key. Still opened and read; the WAL
  appends to a version 2 segment no more, as for version 1 (it cuts a version 3 segment before
  its first write; an empty one is replaced).
* 3: commit rounds with keyed round markers (this document). Frames and records are unchanged.

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

#: What the codecs accept as bytes.
Buffer = bytes | bytearray | memoryview

SEGMENT_MAGIC = b"DNBW"
SEGMENT_VERSION = 3  # what new segments are written with
SEGMENT_VERSIONS_READABLE = (1, 2, 3)
SEGMENT_VERSION_ROUNDS = 2  # the first version whose segments hold round markers
SEGMENT_VERSION_KEYED = 3  # the first version whose round markers' CRC covers the marker key
SEGMENT_HEADER = struct.Struct("<4sHHQQII")
SEGMENT_HEADER_BYTES = SEGMENT_HEADER.size  # 32
SEGMENT_SUFFIX = ".seg"

FRAME_HEADER = struct.Struct("<IIQ")
FRAME_HEADER_BYTES = FRAME_HEADER.size  # 16
# A hard limit of the format, far above any configured max_message_bytes; a length
# beyond it can only be garbage (a torn or corrupt frame), never a real record.
MAX_RECORD_BYTES = 64 * 1024 * 1024
#: A commit round's marker (versions 2 and 3): CRC32C, tag, first offset; the frame header's shape.
ROUND_MARKER = FRAME_HEADER
ROUND_MARKER_BYTES = ROUND_MARKER.size  # 16
ROUND_MARKER_TAG = 0xFFFFFFFF
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
    ``positions`` holds each frame's start position when asked for (else it is empty), and
    ``markers`` then each round marker's (only a scan with ``rounds=True`` accepts markers).
    ``end`` is the byte position just past the last valid frame or marker. ``error`` is None
    when the scan consumed the buffer up to its end exactly.
    """

    records: list[Record]
    positions: list[int]
    # A field named like the tuple method ``count``; the field is what callers read.
    count: int  # type: ignore[assignment]
    first_offset: int
    last_offset: int
    end: int
    error: ScanStop | None
    markers: list[int]


#: Arrow ``binary``/``string`` arrays have int32 offsets: no buffer of :class:`Columns` may pass this.
COLUMN_BUFFER_BYTES_MAX = 2**31 - 1


class Columns(NamedTuple):
    """What ``native.columns.decode_columns`` returns: the kept rows as Arrow-layout buffers
    (layout in ``native/columns.py``)."""

    count: int  # type: ignore[assignment]  # the row count (shadows tuple.count, as above)
    offsets: bytes
    publish_times_ms: bytes
    key_validity: bytes
    key_null_count: int
    key_offsets: bytes
    key_data: bytes
    payload_offsets: bytes
    payload_data: bytes
    attribute_count: int
    attribute_offsets: bytes
    attribute_names_offsets: bytes
    attribute_names_data: bytes
    attribute_values_offsets: bytes
    attribute_values_data: bytes
    frame_count: int
    first_frame_offset: int | None
    last_frame_offset: int | None


def segment_version(header: bytes | bytearray | memoryview) -> int:
    """The format version of a segment header that ``decode_segment_header`` accepted."""
    version: int = SEGMENT_HEADER.unpack_from(header, 0)[1]
    return version


def segment_marker_key(header: bytes | bytearray | memoryview) -> int | None:
    """The marker key of a segment header that ``decode_segment_header`` accepted: what its
    round markers' CRC covers (``encode_round_marker``'s and ``scan_frames``' ``marker_key``),
    or None for a version without keyed markers."""
    fields = SEGMENT_HEADER.unpack_from(header, 0)
    key: int = fields[5]
    return key if fields[1] >= SEGMENT_VERSION_KEYED else None


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"
