"""Power loss that persists unsynced pages out of order (FaultFs.crash_image_pages).

The kernel writes dirty pages back in any order, so a power loss in the middle of a commit
round may keep a LATER page of it and lose an EARLIER one. Recovery must open such a WAL
(the damage lies in the last, unsynced round: truncate it, whatever its bytes look like),
keep every acknowledged offset, and never hand out an offset with a message other than the
one appended under it; and it must still refuse damage to data that was proven synced.
"""
from __future__ import annotations

import os
import random
import time

import pytest

from native import encode_round_marker, encode_segment_header, scan_frames
from native.format import SEGMENT_HEADER_BYTES, SEGMENT_VERSION, segment_file_name, segment_marker_key
from tests.wal.helpers import check_payload, payload_for, read_all, small_config
from wal import CorruptLog, WriteAheadLog
from wal.group import CommitGroup
from wal.journal import JournalConfig
from wal.testing import PAGE_BYTES, FaultFs
from wal.segment import find_valid_frame_after

ROOT = "/wal"
TOPIC = "/ns/t"
DIRECTORY = os.path.join(ROOT, "ns", "t")


def _wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.0005)


def _messages(rng: random.Random, first: int, incarnation: int, count: int) -> list[bytes]:
    # Sizes from a few bytes to more than a page, so rounds span several pages.
    return [payload_for(first + i, incarnation, rng.choice((5, 60, 700, 3000, 9000)))
            for i in range(count)]


def _last_segment(fs: FaultFs) -> bytes:
    names = sorted(n for n in fs.listdir(DIRECTORY) if n.endswith(".seg"))
    return fs.read_all(os.path.join(DIRECTORY, names[-1]))


def _old_rule_refuses(image: FaultFs) -> bool:
    """Whether the pre-round rule would refuse this image: damage followed by a valid frame."""
    data = _last_segment(image)
    scan = scan_frames(data, SEGMENT_HEADER_BYTES, decode=False, rounds=True, marker_key=segment_marker_key(data))
    return scan.error is not None and find_valid_frame_after(data, scan.error.position + 1) is not None


def _check_recovered(wal: WriteAheadLog, acked_through: int, appended: dict[int, bytes]) -> None:
    records = read_all(wal)
    assert [r.offset for r in records] == list(range(wal.next_offset)), "offsets contiguous from 0"
    assert wal.next_offset >= acked_through + 1, "an acknowledged offset was lost"
    for record in records:
        check_payload(record.payload)
        assert record.payload == appended[record.offset], (
            f"offset {record.offset} came back holding a message never appended under it")


def test_power_loss_persisting_pages_out_of_order_always_opens_and_keeps_every_ack():
    images = reordered = 0
    for seed in range(60):
        rng = random.Random(seed)
        config = small_config(segment_bytes_max=rng.choice((8 * 1024, 64 * 1024, 1 << 20)),
                              max_message_bytes=16 * 1024)
        fs = FaultFs()
        appended: dict[int, bytes] = {}  # offset -> the payload last appended under it
        acked_through = -1
        for incarnation in range(4):
            wal = WriteAheadLog.open(ROOT, TOPIC, config, fs=fs)
            _check_recovered(wal, acked_through, appended)
            for _round in range(rng.randrange(0, 5)):  # synced, acknowledged rounds
                first = wal.next_offset
                batch = _messages(rng, first, incarnation, rng.randrange(1, 6))
                assert wal.append_batch(batch) == first
                appended.update(zip(range(first, first + len(batch)), batch))
                wal.flush()
                acked_through = wal.durable_offset
            fs.hold_syncs()
            try:
                first = wal.next_offset  # one more round: written, its fsync in flight
                batch = _messages(rng, first, incarnation, rng.randrange(1, 8))
                assert wal.append_batch(batch) == first
                appended.update(zip(range(first, first + len(batch)), batch))
                _wait_until(lambda: fs.syncs_waiting == 1)
                assert fs.unsynced_bytes() > 0
                image = fs.random_crash_image(rng)
            finally:
                fs.release_syncs()
            wal.close()
            images += 1
            reordered += _old_rule_refuses(image)
            fs = image
        wal = WriteAheadLog.open(ROOT, TOPIC, config, fs=fs)
        _check_recovered(wal, acked_through, appended)
        wal.close()
    # The images really held the state the old rule refused (a valid frame after damage).
    assert images == 240 and reordered >= 10, (images, reordered)


def test_a_later_page_kept_and_an_earlier_one_lost_is_truncated_not_refused():
    # The exact LazyFS finding: the round's first page lost, a later page kept.
    config = small_config(segment_bytes_max=1 << 20, max_message_bytes=16 * 1024)
    fs = FaultFs()
    wal = WriteAheadLog.open(ROOT, TOPIC, config, fs=fs)
    wal.append_batch([payload_for(i, 0, 100) for i in range(5)])
    wal.flush()
    fs.hold_syncs()
    try:
        wal.append_batch([payload_for(5 + i, 0, 1500) for i in range(12)])  # ~18 KiB: 5 pages
        _wait_until(lambda: fs.syncs_waiting == 1)
        for keep_size in (True, False):
            image = fs.crash_image_pages(lambda _path, pages: pages[1:], keep_size=keep_size)
            assert _old_rule_refuses(image)
            recovered = WriteAheadLog.open(ROOT, TOPIC, config, fs=image)
            assert [check_payload(r.payload)[0] for r in read_all(recovered)] == list(range(5))
            assert recovered.append(payload_for(5, 1, 10)) == 5
            recovered.flush()
            recovered.close()
            again = WriteAheadLog.open(ROOT, TOPIC, config, fs=image)
            assert [check_payload(r.payload) for r in read_all(again)][-1] == (5, 1)
            again.close()
    finally:
        fs.release_syncs()
    wal.close()


def _synced_rounds(rounds: int, per_round: int = 4) -> tuple[FaultFs, bytes, list[int]]:
    """A crash image (no clean close, so the checkpoint proves nothing past open) holding
    ``rounds`` fully synced rounds in one segment; also its bytes and marker positions."""
    fs = FaultFs()
    wal = WriteAheadLog.open(ROOT, TOPIC, small_config(segment_bytes_max=1 << 20), fs=fs)
    for r in range(rounds):
        wal.append_batch([payload_for(r * per_round + i, 0, 50) for i in range(per_round)])
        wal.flush()
    image = fs.crash_image()
    wal.close()
    data = _last_segment(image)
    scan = scan_frames(data, SEGMENT_HEADER_BYTES, decode=False, positions=True, rounds=True,
                       marker_key=segment_marker_key(data))
    assert scan.error is None and len(scan.markers) == rounds
    return image, data, scan.markers


def _damaged(image: FaultFs, data: bytes, position: int, flip: bool = True, size: int = 1) -> FaultFs:
    damaged = bytearray(data)
    if flip:
        damaged[position] ^= 0x10
    else:
        damaged[position:position + size] = bytes(size)
    broken = image.crash_image()
    name = sorted(n for n in broken.listdir(DIRECTORY) if n.endswith(".seg"))[-1]
    path = os.path.join(DIRECTORY, name)
    broken.truncate(path, 0)
    handle = broken.open_append(path)
    handle.write([bytes(damaged)])
    handle.sync()
    handle.close()
    return broken


def test_damage_to_synced_rounds_is_still_refused_and_nothing_is_touched():
    image, data, markers = _synced_rounds(6)
    rng = random.Random(7)
    cases = [markers[2] + 3, markers[1]]  # a round marker's CRC, a marker's tag
    cases += [rng.randrange(markers[0], markers[-1]) for _ in range(25)]  # anywhere before the last round
    for position in cases:
        broken = _damaged(image, data, position)
        before = _last_segment(broken)
        with pytest.raises(CorruptLog):
            WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=broken)
        assert _last_segment(broken) == before, "a refused open must not change the segment"
    # A zeroed stretch (a lost page) in the middle of synced data is refused too.
    broken = _damaged(image, data, markers[1] + 20, flip=False, size=200)
    with pytest.raises(CorruptLog, match="later commit round"):
        WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=broken)


def test_damage_in_the_last_round_after_a_crash_is_cut_but_refused_after_a_clean_close():
    image, data, markers = _synced_rounds(3)
    position = markers[-1] + 40  # inside the last round's first frame
    # After a crash nothing proves the last round was synced (no later round, and the
    # checkpoint was written at open): it is repaired like a torn write. Documented limit.
    wal = WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=_damaged(image, data, position))
    assert wal.next_offset == 8
    wal.close()
    # After a clean close the checkpoint records offsets 0-11 as durable: refused.
    closed = FaultFs()
    wal = WriteAheadLog.open(ROOT, TOPIC, small_config(segment_bytes_max=1 << 20), fs=closed)
    for r in range(3):
        wal.append_batch([payload_for(r * 4 + i, 0, 50) for i in range(4)])
        wal.flush()
    wal.close()
    broken = _damaged(closed, _last_segment(closed), position)
    with pytest.raises(CorruptLog, match="checkpoint recorded"):
        WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=broken)


# ------------------------------------------------------------------ a round marker in a message

def _forged_marker(first_offset: int) -> bytes:
    """A round marker as version 2 wrote them (no key): anyone can compute one."""
    return encode_round_marker(first_offset)


def _torn_round_holding(fs: FaultFs, wal: WriteAheadLog, payload: bytes) -> FaultFs:
    """Appends ``payload`` as a round whose fdatasync never returns, and the power loss
    that keeps every page of it but the first (the LazyFS finding)."""
    fs.hold_syncs()
    try:
        wal.append(payload)
        _wait_until(lambda: fs.syncs_waiting == 1)
        return fs.crash_image_pages(lambda path, pages: pages[1:] if path.endswith(".seg") else [],
                                    keep_size=True)
    finally:
        fs.release_syncs()


@pytest.mark.parametrize("forged", [True, False])
def test_a_message_holding_a_round_marker_does_not_make_its_torn_round_look_synced(forged):
    """atk91 F1: recovery searches a torn tail for a later round's marker at every byte,
    payloads included. A message holding a CRC-valid marker, in a round that a power loss
    tore, made the WAL refuse to open over a write never acknowledged. The markers of a
    version 3 segment are keyed with its header's random key: the message's is none of its."""
    fs = FaultFs()
    config = small_config(segment_bytes_max=1 << 20, max_message_bytes=64 * 1024)
    wal = WriteAheadLog.open(ROOT, TOPIC, config, fs=fs)
    wal.append_batch([payload_for(i, 0, 100) for i in range(5)])
    wal.flush()
    tail = b"".join(_forged_marker(offset) for offset in (6, 1 << 20, 1 << 40)) if forged else b"m" * 48
    image = _torn_round_holding(fs, wal, b"x" * 12_000 + tail + b"y" * 100)
    wal.close()
    data = _last_segment(image)
    assert (tail in data) and scan_frames(data, SEGMENT_HEADER_BYTES, rounds=True,
                                          marker_key=segment_marker_key(data)).error is not None
    recovered = WriteAheadLog.open(ROOT, TOPIC, config, fs=image)
    assert [check_payload(r.payload)[0] for r in read_all(recovered)] == list(range(5))
    assert recovered.append(payload_for(5, 1, 10)) == 5
    recovered.close()


def test_a_message_holding_a_round_marker_in_a_journaled_group_opens_too():
    # The topic's acknowledged rounds are behind the journal's checkpoint, so the replay
    # leaves its segment's tail to the WAL's own recovery.
    fs = FaultFs()
    group = CommitGroup(ROOT, fs, journal=JournalConfig(checkpoint_interval_s=1000.0))
    config = small_config(segment_bytes_max=1 << 20, max_message_bytes=64 * 1024)
    wal = WriteAheadLog.open(ROOT, TOPIC, config, group=group)
    wal.append_batch([payload_for(i, 0, 100) for i in range(5)])
    wal.flush()
    assert group.journal is not None and group.journal.checkpoint()
    image = _torn_round_holding(fs, wal, b"x" * 12_000 + _forged_marker(1 << 40) + b"y" * 100)
    wal.close()
    group.close()
    again = CommitGroup(ROOT, image, journal=JournalConfig())
    try:
        recovered = WriteAheadLog.open(ROOT, TOPIC, config, group=again)
        assert [check_payload(r.payload)[0] for r in read_all(recovered)] == list(range(5))
        recovered.close()
    finally:
        again.close()


def test_segments_are_written_with_a_random_marker_key_their_markers_carry():
    fs = FaultFs()
    keys = set()
    for topic in ("/ns/a", "/ns/b", "/ns/c"):
        wal = WriteAheadLog.open(ROOT, topic, small_config(), fs=fs)
        wal.append_batch([b"a", b"b"])
        wal.flush()
        path = wal.segments()[-1].path
        wal.close()
        data = fs.read_all(path)
        assert data[4] == SEGMENT_VERSION == 3
        key = segment_marker_key(data)
        keys.add(key)
        marked = scan_frames(data, SEGMENT_HEADER_BYTES, positions=True, rounds=True, marker_key=key)
        assert marked.error is None and marked.count == 2 and len(marked.markers) == 1
        assert scan_frames(data, SEGMENT_HEADER_BYTES, rounds=True).error.reason == "crc"
    assert len(keys) == 3


# ------------------------------------------------------------------ older format versions

def _old_segment(fs: FaultFs, payloads: list[bytes], version: int) -> str:
    """A segment of format ``version`` (1: no round markers; 2: markers without a key) at
    base offset 0, as the WAL wrote before."""
    from native import encode_batch
    fs.makedirs(DIRECTORY)
    path = os.path.join(DIRECTORY, segment_file_name(0))
    handle = fs.open_append(path)
    frames = [encode_batch(0, [(1, None, None, p) for p in payloads])] if payloads else []
    if version == 2 and payloads:
        frames.insert(0, encode_round_marker(0))
    handle.write([encode_segment_header(0, 1_700_000_000_000, version=version), *frames])
    handle.sync()
    handle.close()
    fs.fsync_dir(DIRECTORY)
    return path


def _v1_segment(fs: FaultFs, payloads: list[bytes]) -> str:
    return _old_segment(fs, payloads, 1)


@pytest.mark.parametrize("version", [1, 2])
def test_older_segments_open_and_new_rounds_go_to_a_current_segment(version):
    fs = FaultFs()
    old = _old_segment(fs, [payload_for(i) for i in range(5)], version)
    wal = WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=fs)
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(5))
    assert wal.append(payload_for(5)) == 5
    wal.flush()
    infos = wal.segments()
    assert [(s.base_offset, s.last_offset) for s in infos] == [(0, 4), (5, 5)]
    assert fs.read_all(old)[4] == version and fs.read_all(infos[-1].path)[4] == SEGMENT_VERSION
    wal.close()
    wal = WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=fs)
    assert [check_payload(r.payload)[0] for r in read_all(wal)] == list(range(6))
    assert wal.read_frames(0, 1 << 20)[1:] == (0, 4)
    wal.close()


@pytest.mark.parametrize("version", [1, 2])
def test_an_empty_older_segment_is_replaced_by_a_current_one(version):
    fs = FaultFs()
    path = _old_segment(fs, [], version)
    wal = WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=fs)
    assert fs.read_all(path)[4] == SEGMENT_VERSION
    wal.append(b"x")
    wal.close()
    assert [r.offset for r in read_all(WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=fs))] == [0]


def test_version_1_keeps_the_strict_rule_damage_then_a_valid_frame_is_refused():
    fs = FaultFs()
    path = _v1_segment(fs, [payload_for(i, 0, 50) for i in range(6)])
    data = bytearray(fs.read_all(path))
    data[SEGMENT_HEADER_BYTES + 30] ^= 1  # inside frame 0; frames 1-5 stay valid
    fs.truncate(path, 0)
    handle = fs.open_append(path)
    handle.write([bytes(data)])
    handle.sync()
    handle.close()
    with pytest.raises(CorruptLog, match="followed by a valid frame"):
        WriteAheadLog.open(ROOT, TOPIC, small_config(), fs=fs)


def test_page_model_keeps_synced_bytes_and_zeroes_lost_pages():
    fs = FaultFs()
    fs.makedirs("/d")
    handle = fs.open_append("/d/f")
    handle.write([b"s" * 5000])
    handle.sync()
    handle.write([b"u" * 10000])  # bytes [5000, 15000): pages 1, 2, 3 dirty
    fs.fsync_dir("/d")
    seen = []
    image = fs.crash_image_pages(lambda path, pages: seen.append((path, pages)) or [3])
    assert seen == [("/d/f", [1, 2, 3])]
    data = image.read_all("/d/f")
    assert data == b"s" * 5000 + bytes(3 * PAGE_BYTES - 5000) + b"u" * (15000 - 3 * PAGE_BYTES)
    short = fs.crash_image_pages(lambda _path, pages: [1], keep_size=False).read_all("/d/f")
    assert short == b"s" * 5000 + b"u" * (2 * PAGE_BYTES - 5000)
    assert fs.crash_image_pages(lambda _path, pages: [], keep_size=False).read_all("/d/f") == b"s" * 5000
