"""The segment index: where a read starts scanning for an offset.

A round this process wrote is indexed at its first frame only (the writer knows no other
frame's position), so a reader catching up through one big round used to rescan from
that frame on every read: quadratic in the round's size (atk78). Reads now index what they
found (``Segment.learn_index``). The promise checked here: a catch-up read through any
round reads each byte a bounded number of times, and every record exactly once, in order.
"""
from __future__ import annotations

import random

import pytest

from native.format import SEGMENT_HEADER_BYTES
from wal import WriteAheadLog
from wal.fs import RealFs, ReadFile
from wal.segment import Segment

from tests.wal.helpers import check_payload, payload_for, small_config


class _CountingRead:
    def __init__(self, inner: ReadFile, counter: list[int]) -> None:
        self._inner = inner
        self._counter = counter

    def pread(self, position: int, size: int) -> bytes:
        data = self._inner.pread(position, size)
        self._counter[0] += len(data)
        return data

    def close(self) -> None:
        self._inner.close()


class _CountingFs(RealFs):
    """The real file system, counting the bytes read through ``open_read``."""

    def __init__(self) -> None:
        self.read_bytes = [0]

    def open_read(self, path: str) -> ReadFile:
        return _CountingRead(super().open_read(path), self.read_bytes)


def _segment(points: list[tuple[int, int]]) -> Segment:
    segment = Segment(0, "/x", 0, -1, SEGMENT_HEADER_BYTES)
    for offset, position in points:
        segment.add_index(offset, position, 1)
    return segment


def test_learned_points_keep_the_index_sorted_and_spaced() -> None:
    segment = _segment([(0, 100), (1000, 100_000)])
    segment.learn_index(500, 50_000, 1000)
    segment.learn_index(500, 50_000, 1000)  # already there
    segment.learn_index(501, 50_500, 1000)  # too close to 500's point
    segment.learn_index(999, 99_500, 1000)  # too close to 1000's point
    segment.learn_index(1, 600, 1000)  # too close to the first point
    segment.learn_index(2000, 200_000, 1000)  # past the last point
    assert segment.index_offsets == [0, 500, 1000, 2000]
    assert segment.index_positions == [100, 50_000, 100_000, 200_000]
    assert segment.seek(700) == (500, 50_000)
    assert segment.seek(2500) == (2000, 200_000)


def test_random_learning_keeps_offsets_and_positions_in_the_same_order() -> None:
    rng = random.Random(7)
    frames = [(offset, SEGMENT_HEADER_BYTES + offset * 37) for offset in range(5000)]
    segment = _segment([frames[0]])
    for _ in range(2000):
        segment.learn_index(*rng.choice(frames), 400)
    assert segment.index_offsets == sorted(segment.index_offsets)
    assert segment.index_positions == [SEGMENT_HEADER_BYTES + o * 37 for o in segment.index_offsets]
    gaps = [b - a for a, b in zip(segment.index_positions, segment.index_positions[1:])]
    assert min(gaps) >= 400


@pytest.mark.parametrize("live_wal", [False, True], ids=["reopened", "written-here"])
@pytest.mark.parametrize("count,size", [(3000, 100), (300, 3000)], ids=["small-frames", "a-frame-per-read"])
def test_a_catch_up_read_through_one_big_round_reads_each_byte_a_bounded_number_of_times(
        tmp_path, live_wal: bool, count: int, size: int) -> None:
    """Small frames: many per read. Frames of 3,000 B with reads of 4,096: one per read, so
    the only frame a read finds is the one to index (atk79)."""
    fs = _CountingFs()
    # No cache to speak of: every read goes to the file. One append_batch is one round.
    config = small_config(segment_bytes_max=64 << 20, cache_messages_max=1, cache_bytes_max=1,
                          read_chunk_bytes=4096, index_interval_bytes=1024, max_message_bytes=16 * 1024)
    wal = WriteAheadLog.open(str(tmp_path), "/ns/big", config, fs=fs)
    try:
        wal.append_batch([payload_for(offset, size=size) for offset in range(count)])
        wal.flush()
        if not live_wal:
            wal.close()
            wal = WriteAheadLog.open(str(tmp_path), "/ns/big", config, fs=fs)
        [segment] = wal.segments()
        fs.read_bytes[0] = 0
        with wal.reader(0, live=False) as reader:
            offsets = [check_payload(record.payload)[0] for record in reader]
        assert offsets == list(range(count))
        # Each read starts within one index interval (plus a frame) of where the last one
        # stopped: at most the frame before it is read again. Rescanning from the round's
        # start every time read 50-150x the segment.
        assert fs.read_bytes[0] <= 3 * segment.size_bytes, (fs.read_bytes[0], segment.size_bytes)
    finally:
        wal.close()


def test_reads_from_the_middle_of_a_big_round_find_every_offset(tmp_path) -> None:
    config = small_config(segment_bytes_max=64 << 20, cache_messages_max=1, cache_bytes_max=1,
                          read_chunk_bytes=2048, index_interval_bytes=512)
    count = 2000
    rng = random.Random(11)
    with WriteAheadLog.open(str(tmp_path), "/ns/mid", config) as wal:
        wal.append_batch([payload_for(offset) for offset in range(count)])
        wal.flush()
        for start in [rng.randrange(count) for _ in range(60)] + [count - 1, 0]:
            with wal.reader(start, live=False) as reader:
                offsets = [check_payload(record.payload)[0] for record in reader]
            assert offsets == list(range(start, count)), start
            frames, first, last = wal.read_frames(start, 1000)
            assert first == start and last >= start
