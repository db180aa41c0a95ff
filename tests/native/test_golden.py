"""Golden bytes pin the WAL segment and dnb1 object formats.

A format change that alters bytes fails here. To change the format on purpose, bump the
version in the spec and regenerate: ``DNB_REGENERATE_GOLDEN=1 pytest tests/native/test_golden.py``
(then review and commit the new files under tests/data/).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import zstandard

from native import object_format as of
from native.format import segment_marker_key
from tests.native.strategies import sample_messages

DATA = Path(__file__).resolve().parent.parent / "data"
REGENERATE = os.environ.get("DNB_REGENERATE_GOLDEN", "") not in ("", "0")

FIRST_OFFSET = 1000
CREATED_MS = 1_700_000_000_000


def _golden(name: str, produced: bytes) -> bytes:
    path = DATA / name
    if REGENERATE:
        DATA.mkdir(parents=True, exist_ok=True)
        path.write_bytes(produced)
    assert path.exists(), f"{path} is missing; run with DNB_REGENERATE_GOLDEN=1 once"
    return path.read_bytes()


def _frames(codec) -> bytes:
    return codec.encode_batch(FIRST_OFFSET, sample_messages(12))


def test_wal_segment_golden_version_1(codec):
    # Format version 1 (frames back to back, no round markers): still written by nobody,
    # still read; this fixture is what segments from before the upgrade look like.
    produced = codec.encode_segment_header(FIRST_OFFSET, CREATED_MS, version=1) + _frames(codec)
    golden = _golden("golden_segment.seg", produced)
    assert produced == golden
    assert codec.decode_segment_header(golden[:32]) == (FIRST_OFFSET, CREATED_MS)
    scan = codec.scan_frames(golden, 32, expected_offset=FIRST_OFFSET)
    assert scan.error is None and scan.count == 12
    assert [(r.publish_time, r.key, r.attributes or None, r.payload) for r in scan.records] == \
        sample_messages(12)


def _segment_v2(codec) -> bytes:
    """Header, then two commit rounds: a marker before frames 0-4 and one before 5-11."""
    frames = _frames(codec)
    split = codec.scan_frames(frames, positions=True).positions[5]
    return (codec.encode_segment_header(FIRST_OFFSET, CREATED_MS, version=2)
            + codec.encode_round_marker(FIRST_OFFSET) + frames[:split]
            + codec.encode_round_marker(FIRST_OFFSET + 5) + frames[split:])


MARKER_KEY = 0x5EED_1234


def _segment_v3(codec) -> bytes:
    """As ``_segment_v2``, in format version 3: the header holds a marker key, which both
    markers' CRC covers."""
    frames = _frames(codec)
    split = codec.scan_frames(frames, positions=True).positions[5]
    return (codec.encode_segment_header(FIRST_OFFSET, CREATED_MS, version=3, marker_key=MARKER_KEY)
            + codec.encode_round_marker(FIRST_OFFSET, MARKER_KEY) + frames[:split]
            + codec.encode_round_marker(FIRST_OFFSET + 5, MARKER_KEY) + frames[split:])


def test_wal_segment_golden_version_3(codec):
    produced = _segment_v3(codec)
    golden = _golden("golden_segment_v3.seg", produced)
    assert produced == golden
    assert golden[4:6] == (3).to_bytes(2, "little")
    assert golden[24:28] == MARKER_KEY.to_bytes(4, "little")
    assert codec.decode_segment_header(golden[:32]) == (FIRST_OFFSET, CREATED_MS)
    assert segment_marker_key(golden) == MARKER_KEY
    scan = codec.scan_frames(golden, 32, expected_offset=FIRST_OFFSET, positions=True, rounds=True,
                             marker_key=MARKER_KEY)
    assert scan.error is None and scan.count == 12 and len(scan.markers) == 2
    assert [(r.publish_time, r.key, r.attributes or None, r.payload) for r in scan.records] == \
        sample_messages(12)
    # Without the key, or with another one, the first marker is a CRC mismatch.
    for other in (None, MARKER_KEY ^ 1):
        stop = codec.scan_frames(golden, 32, rounds=True, marker_key=other).error
        assert (stop.position, stop.reason) == (32, "crc")


def test_wal_segment_golden_version_2(codec):
    produced = _segment_v2(codec)
    golden = _golden("golden_segment_v2.seg", produced)
    assert produced == golden
    assert golden[4:6] == (2).to_bytes(2, "little")
    assert codec.decode_segment_header(golden[:32]) == (FIRST_OFFSET, CREATED_MS)
    assert segment_marker_key(golden) is None
    scan = codec.scan_frames(golden, 32, expected_offset=FIRST_OFFSET, positions=True, rounds=True)
    assert scan.error is None and scan.count == 12 and len(scan.markers) == 2
    assert [(r.publish_time, r.key, r.attributes or None, r.payload) for r in scan.records] == \
        sample_messages(12)
    assert codec.scan_frames(golden, 32, rounds=False).error.reason == "bad_length"


def test_dnb1_object_golden(codec):
    produced = of.write_object(_frames(codec), topic="golden/topic", block_bytes=300,
                               zstd_level=0, codec=codec)
    golden = _golden("golden_object.dnb1", produced)
    assert produced == golden
    footer = of.parse_footer(golden, "golden", len(golden), codec=codec)
    assert (footer.first_offset, footer.last_offset, len(footer.blocks)) == (1000, 1011, 4)
    assert of.read_all_frames(golden, "golden", codec=codec) == _frames(codec)


def test_dnb1_object_zstd_golden(codec):
    """Old zstd objects must stay readable; byte equality holds only for the same libzstd."""
    produced = of.write_object(_frames(codec), topic="golden/topic", block_bytes=300,
                               zstd_level=3, codec=codec)
    golden = _golden("golden_object_zstd.dnb1", produced)
    meta = json.loads(_golden("golden_object_zstd.json", json.dumps(
        {"zstd_version": zstandard.ZSTD_VERSION, "level": 3}).encode()))
    assert of.read_all_frames(golden, "golden", codec=codec) == _frames(codec)
    if tuple(meta["zstd_version"]) != tuple(zstandard.ZSTD_VERSION):
        pytest.skip(f"libzstd {zstandard.ZSTD_VERSION} differs from the golden's {meta['zstd_version']}")
    assert produced == golden
