"""Recovery: torn tails are repaired, corruption anywhere else is refused with nothing changed."""
from __future__ import annotations

import os
import random

import pytest

from native.format import SEGMENT_HEADER_BYTES
from tests.wal.helpers import check_payload, payload_for, read_all, small_config
from wal import CorruptLog, WriteAheadLog
from wal.checkpoint import CHECKPOINT_NAME
from wal.testing import FaultFs


def _build(root: str, count: int = 300, segment_bytes_max: int = 4096) -> list:
    log = WriteAheadLog.open(root, "/ns/t", small_config(segment_bytes_max=segment_bytes_max))
    for offset in range(count):
        log.append(payload_for(offset))
        if offset % 20 == 19:
            log.flush()
    log.flush()
    infos = log.segments()
    log.close()
    return infos


def _snapshot(directory: str) -> dict:
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def _frame_starts(path: str) -> list[int]:
    return _scan(path).positions


def _scan(path: str):
    from native import scan_frames
    from native.format import segment_marker_key
    data = open(path, "rb").read()
    return scan_frames(data, pos=SEGMENT_HEADER_BYTES, decode=False, positions=True, rounds=True,
                       marker_key=segment_marker_key(data))


def test_tail_truncation_at_every_byte_of_the_last_frames_is_repaired(tmp_path):
    """Written on real files; each cut is then recovered on an in-memory copy of the
    directory (FaultFs: the same recovery code, without the real fsyncs of an open, an
    append and a close at every byte, which made this test take half a minute)."""
    infos = _build(str(tmp_path), count=60, segment_bytes_max=1 << 20)
    path = infos[-1].path
    directory = os.path.dirname(path)
    original = open(path, "rb").read()
    files = {name: data for name, data in _snapshot(directory).items() if name != CHECKPOINT_NAME}
    scan = _scan(path)
    starts = scan.positions
    # Where a valid item (frame or commit-round marker) ends: what a repair may cut back to.
    frame_ends = [min([b for b in starts[i + 1:] + scan.markers + [len(original)] if b > s])
                  for i, s in enumerate(starts)]
    boundaries = sorted({SEGMENT_HEADER_BYTES, *frame_ends, *(m + 16 for m in scan.markers)})
    assert len(scan.markers) >= 3
    for cut in range(scan.markers[-2], len(original)):
        fs = FaultFs()
        fs.makedirs("/r/ns/t")
        for name, data in files.items():
            handle = fs.open_append(os.path.join("/r/ns/t", name))
            handle.write([original[:cut] if os.path.join(directory, name) == path else data])
            handle.sync()
            handle.close()
        fs.fsync_dir("/r/ns/t")
        segment = os.path.join("/r/ns/t", os.path.basename(path))
        log = WriteAheadLog.open("/r", "/ns/t", small_config(segment_bytes_max=1 << 20), fs=fs)
        kept = sum(1 for end in frame_ends if end <= cut)
        assert log.next_offset == kept, f"cut at {cut}"
        assert fs.file_size(segment) == max(b for b in boundaries if b <= cut), "torn bytes must be cut"
        assert [check_payload(r.payload)[0] for r in read_all(log)] == list(range(kept))
        assert log.append(payload_for(kept)) == kept, "offsets continue at last valid + 1"
        log.close()


def test_tail_garbage_after_valid_frames_is_repaired(tmp_path):
    infos = _build(str(tmp_path), count=40, segment_bytes_max=1 << 20)
    with open(infos[-1].path, "ab") as f:
        f.write(b"\x00" * 100 + os.urandom(333))
    log = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
    assert log.next_offset == 40
    log.close()


@pytest.mark.parametrize("where", ["sealed", "last_middle", "header"])
def test_bit_flips_in_the_middle_refuse_to_open_and_change_nothing(tmp_path, where):
    infos = _build(str(tmp_path))
    assert len(infos) >= 3
    rng = random.Random(where)
    directory = os.path.dirname(infos[0].path)
    target = infos[1].path if where == "sealed" else infos[-1].path
    pristine = open(target, "rb").read()
    starts = _frame_starts(target)
    for _trial in range(15):
        if where == "header":
            position = rng.randrange(0, SEGMENT_HEADER_BYTES)
        elif where == "sealed":
            position = rng.randrange(SEGMENT_HEADER_BYTES, len(pristine))
        else:  # inside a frame of the last segment that valid frames follow
            position = rng.randrange(starts[0], starts[-2])
        flipped = bytearray(pristine)
        flipped[position] ^= 1 << rng.randrange(8)
        with open(target, "wb") as f:
            f.write(flipped)
        before = _snapshot(directory)
        with pytest.raises(CorruptLog) as caught:
            WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
        assert caught.value.path == target
        assert _snapshot(directory) == before, "a refused open must not change any file"
        with open(target, "wb") as f:
            f.write(pristine)
    log = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
    assert [check_payload(r.payload)[0] for r in read_all(log)] == list(range(300))
    log.close()


def test_missing_sealed_segment_is_refused(tmp_path):
    infos = _build(str(tmp_path))
    os.remove(infos[1].path)  # a gap between segments
    with pytest.raises(CorruptLog):
        WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())


def test_missing_newest_sealed_segments_are_refused_via_checkpoint(tmp_path):
    infos = _build(str(tmp_path))
    os.remove(infos[-1].path)  # what is left looks clean, but the checkpoint knows better
    with pytest.raises(CorruptLog):
        WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())


def test_all_segments_gone_is_refused_not_restarted_at_zero(tmp_path):
    infos = _build(str(tmp_path), count=50)
    for info in infos:
        os.remove(info.path)
    with pytest.raises(CorruptLog):
        WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())


def test_all_segments_gone_after_a_crash_right_after_a_rotation_is_refused(tmp_path):
    """A crash just after a rotation leaves a checkpoint whose next offset is the new active
    segment's base (nothing in it yet). With every segment gone, the sealed ones it names
    are lost: refused, not continued at the checkpoint's offset (atk37 F02)."""
    from wal.checkpoint import read_checkpoint, write_checkpoint
    from wal.fs import RealFs

    infos = _build(str(tmp_path))
    assert len(infos) > 2
    directory = os.path.dirname(infos[0].path)
    state = read_checkpoint(RealFs(), directory)
    assert state is not None
    write_checkpoint(RealFs(), directory, {**state, "next_offset": state["sealed_next_offset"]})
    for info in infos:
        os.remove(info.path)
    with pytest.raises(CorruptLog, match="no segment is left"):
        WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())


def test_empty_wal_whose_segment_vanished_continues_from_checkpoint(tmp_path):
    log = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config(), initial_offset=22)
    path = log.segments()[0].path
    log.close()
    os.remove(path)  # held no records, so nothing was lost
    again = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
    assert again.next_offset == 22, "offsets must never restart at 0"
    again.close()


def test_missing_oldest_segment_is_refused_not_silently_retained_away(tmp_path):
    """Only truncate_before may drop leading segments, and it records the new first offset
    in the checkpoint before unlinking. A first segment that vanished otherwise is lost
    durable data: opening must refuse, not start at a later first offset."""
    infos = _build(str(tmp_path))
    assert len(infos) > 2
    os.remove(infos[0].path)
    with pytest.raises(CorruptLog):
        WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())


def test_segments_retention_removed_are_not_mistaken_for_loss(tmp_path):
    infos = _build(str(tmp_path))
    log = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
    assert log.truncate_before(infos[2].base_offset) == 2
    log.close()
    again = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
    assert again.first_offset == infos[2].base_offset
    again.close()


def test_a_round_never_acknowledged_that_survived_a_process_crash_cannot_make_a_power_loss_refuse_the_wal():
    """SIGKILL while a round's fsync is in flight: the round stays in the page cache,
    never acknowledged, and the next open recovers it and writes its checkpoint. If that
    checkpoint vouched for the round while its bytes were still unsynced, a power loss
    before the WAL's next sync would leave a log ending below the checkpoint, and every
    later open would refuse the WAL over a write nobody was told was durable."""
    import time

    from wal.testing.faultfs import FaultFs

    fs = FaultFs()
    log = WriteAheadLog.open("/root", "/ns/t", small_config(), fs=fs)
    for offset in range(5):
        log.append(payload_for(offset))
    log.flush()
    fs.hold_syncs()
    try:
        for offset in range(5, 10):
            log.append(payload_for(offset))
        deadline = time.monotonic() + 60.0  # a hang guard, never an expected duration
        while fs.syncs_waiting == 0:
            assert time.monotonic() < deadline, "the round's sync never started"
            time.sleep(0.01)
        assert log.durable_offset == 4  # 5..9 written, not acknowledged
        restarted = fs.process_crash_image()  # SIGKILL: the page cache keeps 5..9, unsynced
    finally:
        fs.release_syncs()
    again = WriteAheadLog.open("/root", "/ns/t", small_config(), fs=restarted)
    assert again.next_offset == 10  # recovery keeps the valid round (its outcome was unknown)
    power_lost = restarted.crash_image()
    again.close()
    log.close()  # the killed process's WAL, on its own file system
    after_power_loss = WriteAheadLog.open("/root", "/ns/t", small_config(), fs=power_lost)
    try:
        assert after_power_loss.next_offset in (5, 10)  # whichever: never a refusal
        records = read_all(after_power_loss, 0)
        assert [r.offset for r in records] == list(range(after_power_loss.next_offset))
    finally:
        after_power_loss.close()
