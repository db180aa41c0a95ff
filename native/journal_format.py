"""The shared-journal format. This docstring is the specification; everything else refers to it.

Integers are little-endian; CRC32C is the one of ``native/format.py``.

What the journal is for
=======================
A broker hosts many topics under one WAL root. Each topic keeps its own segment files
(``native/format.py``), which stay the only thing readers, the uploader and retention use.
To make a commit round of every topic durable with ONE fdatasync, the root's commit group
also appends the round to a shared journal and syncs only that file; the topics' segment
files are written in the same round but synced lazily, at journal checkpoints. After a
crash the journal is replayed into the segments before any topic's WAL opens. Design,
failure semantics and the checkpoint rule: docs/WAL.md, "The shared journal".

Files
=====
The journal of a root lives in ``<root>/.journal/`` (a dot name: never a namespace). Its
files are named ``<file sequence, 20 digits>.jnl``; the name is the file's identity. A new
file holds only its header and grows as rounds are appended until it passes
``journal_file_bytes``; files the checkpoint has passed are recycled (new header, new
name), so in steady state rounds overwrite old bytes and a round's fdatasync has no size
change to commit. A file starts with a 32-byte header::

    0   4  magic            b"DNBJ"
    4   2  format version   1
    6   2  flags            0
    8   8  file sequence    u64, equal to the file name's
    16  8  file nonce       u64, random, new each time a file is created or recycled
    24  4  reserved         0
    28  4  header CRC32C    over bytes [0, 28)

and is followed by rounds, back to back from byte 32. After the last round lies the end of
the file (a new one) or whatever an earlier use of the file left (a recycled one), which
cannot pass for a round of this file because a round carries the file's nonce.

Rounds
======
One round per commit round of the group, written with one write and made durable with one
fdatasync before the next round is written. A 48-byte round header::

    0   4  header CRC32C    over bytes [4, 48)
    4   4  tag              0x524E4A44 (b"DJNR")
    8   8  file nonce       the nonce of the file the round is in
    16  8  round sequence   u64; +1 per round across the journal's files, never reused
    24  8  round length     bytes, this header included
    32  4  entry count      >= 1
    36  4  entries CRC32C   over every entry header and its path, in order
    40  8  reserved         0

then ``entry count`` entries, each a 56-byte entry header, the WAL's path, then its bytes::

    0   16 WAL id           the topic WAL directory's ``.walid`` (which WAL instance wrote it)
    16  8  segment base     u64, the base offset (= file name) of the segment written to
    24  8  segment position u64, where in that segment the entry's bytes were written
    32  8  first offset     u64, the offset of the first frame
    40  4  record count     u32, >= 1
    44  4  length L         u32, bytes after the path
    48  2  path length P    u16, 1 <= P <= 1024
    50  6  reserved         0
    56  P  path             UTF-8, the WAL directory relative to the root (``<namespace>/<topic>``)
    56+P L bytes            exactly what the round wrote to the segment: a round marker,
                            then the frames (``native/format.py``, "Commit rounds")

A round is valid when its header CRC, tag, nonce and sequence (the one expected next) hold,
its entries' CRC holds, its entries fill exactly ``round length``, and every entry's bytes
scan as one commit round of exactly ``record count`` frames from ``first offset`` (frame
CRCs, contiguous offsets, the marker). Nothing of a round is used unless all of it is valid.

Checkpoint and replay
=====================
``<root>/.journal/wal.ckpt`` (the first, whole-file checkpoint layout of ``native/format.py``:
temp, fsync, rename, fsync dir)
holds ``file``, ``position`` and ``round``: every segment byte of every round before that
point is synced in its segment file, so replay starts there. It is written when the journal
is created (right after its first file) and only ever names a file that is durable, so a
checkpoint that is unreadable, names a missing file, or a file at or after it whose header
is invalid or names another sequence, is damage: ``CorruptLog``, nothing written (replay
cannot know where the rounds start, and guessing could cut data written outside the
journal since). No checkpoint at all is fine only while no file holds a round header of its
nonce (a crash while the journal was being created). Replay reads valid rounds in
sequence; the log ends at the first position where no valid round with the expected
sequence starts, unless the next file's first round continues the sequence (the writer
starts a new file when a round does not fit the current one).

Only the last round can be unsynced: round *k + 1* is written only after round *k*'s
fdatasync returned. So where the log ends, expecting round *k*, a round header of this
file's nonce with a sequence ABOVE *k* anywhere after it (further on in the file, or in a
later file) proves that what stopped the scan had been synced: corruption, refused
(``CorruptLog``), nothing written. Without one, the end is the unsynced tail of round *k*
(whose header may be intact, where the scan stopped or at the start of the next file):
ignored, whatever its bytes look like.

Each WAL's entries after the checkpoint must be contiguous (offsets, and positions within a
segment). They are applied to the WAL whose ``.walid`` they name: the segment is truncated
at the first entry's position (what follows it there is either what the journal holds or
was never acknowledged), the entries' bytes are written, the file is fsynced. Entries of a
WAL id no directory of the root holds are skipped when the directory at their path is gone
(the WAL was deleted, or moved out of the root after it was closed, which synced it), holds
no segment, or has another readable id (deleted and created again); when that directory
holds segments but its ``.walid`` is missing or damaged, nothing can tell whether the
entries are its own: ``CorruptLog``. Two directories with the id of an entry: ``CorruptLog``.
Entries of a segment below the WAL's first segment (retention removed it) are skipped. A
segment the entries need that is missing, or shorter than the first entry's position
(synced bytes lost), is ``CorruptLog``.
"""
from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import NamedTuple

from native import crc32c

JOURNAL_DIR = ".journal"
JOURNAL_SUFFIX = ".jnl"
JOURNAL_MAGIC = b"DNBJ"
JOURNAL_VERSION = 1

FILE_HEADER = struct.Struct("<4sHHQQII")  # magic, version, flags, sequence, nonce, reserved, crc
FILE_HEADER_BYTES = FILE_HEADER.size  # 32
ROUND_HEADER = struct.Struct("<IIQQQIIQ")  # crc, tag, nonce, round, length, count, entries crc, reserved
ROUND_HEADER_BYTES = ROUND_HEADER.size  # 48
ROUND_TAG = 0x524E4A44
# wal id, segment base, position, first offset, count, length, path length, reserved
ENTRY_HEADER = struct.Struct("<16sQQQIIH6s")
ENTRY_HEADER_BYTES = ENTRY_HEADER.size  # 56
ENTRY_PATH_BYTES_MAX = 1024
WAL_ID_BYTES = 16
#: An entry's length field is a u32: a topic's round larger than this cannot be journaled.
ENTRY_BYTES_MAX = (1 << 32) - 1

_TAG_BYTES = struct.pack("<I", ROUND_TAG)


class FileHeader(NamedTuple):
    sequence: int
    nonce: int


class RoundHeader(NamedTuple):
    nonce: int
    round: int
    length: int
    entry_count: int
    entries_crc: int


class EntryHeader(NamedTuple):
    wal_id: bytes
    segment_base: int
    position: int
    first_offset: int
    record_count: int
    length: int
    path_length: int
    reserved: bytes


def journal_file_name(sequence: int) -> str:
    return f"{sequence:020d}{JOURNAL_SUFFIX}"


def parse_journal_file_name(name: str) -> int | None:
    if len(name) != 20 + len(JOURNAL_SUFFIX) or not name.endswith(JOURNAL_SUFFIX) or not name[:20].isdigit():
        return None
    return int(name[:20])


def new_nonce() -> int:
    return int.from_bytes(os.urandom(8), "little")


def encode_file_header(sequence: int, nonce: int) -> bytes:
    body = FILE_HEADER.pack(JOURNAL_MAGIC, JOURNAL_VERSION, 0, sequence, nonce, 0, 0)[:28]
    return body + struct.pack("<I", crc32c(body))


def decode_file_header(data: bytes | memoryview) -> FileHeader | None:
    """The header's sequence and nonce, or None when it is not a valid version 1 header."""
    if len(data) < FILE_HEADER_BYTES:
        return None
    magic, version, flags, sequence, nonce, _reserved, crc = FILE_HEADER.unpack_from(data, 0)
    if magic != JOURNAL_MAGIC or version != JOURNAL_VERSION or flags != 0:
        return None
    if crc32c(bytes(data[:28])) != crc:
        return None
    return FileHeader(sequence, nonce)


def encode_round_header(nonce: int, round_sequence: int, length: int, count: int, entry_headers: bytes) -> bytes:
    body = ROUND_HEADER.pack(0, ROUND_TAG, nonce, round_sequence, length, count, crc32c(entry_headers), 0)[4:]
    return struct.pack("<I", crc32c(body)) + body


def decode_round_header(data: bytes | memoryview, position: int) -> RoundHeader | None:
    """The round header at ``position`` when its CRC and tag hold (nonce and sequence are
    the caller's to check), else None."""
    if position + ROUND_HEADER_BYTES > len(data):
        return None
    crc, tag, nonce, round_sequence, length, count, entries_crc, reserved = ROUND_HEADER.unpack_from(data, position)
    if tag != ROUND_TAG or reserved != 0:
        return None
    if crc32c(bytes(data[position + 4:position + ROUND_HEADER_BYTES])) != crc:
        return None
    return RoundHeader(nonce, round_sequence, length, count, entries_crc)


def encode_entry_header(wal_id: bytes, segment_base: int, position: int, first_offset: int, record_count: int,
                        length: int, path: bytes) -> bytes:
    """The entry header followed by the WAL's path (what the entries CRC covers)."""
    return ENTRY_HEADER.pack(wal_id, segment_base, position, first_offset, record_count, length, len(path),
                             b"\0" * 6) + path


def decode_entry_header(data: bytes | memoryview, position: int) -> EntryHeader:
    return EntryHeader(*ENTRY_HEADER.unpack_from(data, position))


def find_round_headers(data: bytes, start: int, nonce: int) -> Iterator[int]:
    """Positions at or after ``start`` where a round header of the file with ``nonce``
    could start (its tag and nonce are there; the caller checks the header's CRC), found
    with ``bytes.find``: stale rounds of a recycled file and payload bytes cannot match
    without the nonce."""
    needle = _TAG_BYTES + struct.pack("<Q", nonce)
    at = data.find(needle, start + 4)
    while at != -1:
        yield at - 4
        at = data.find(needle, at + 1)
