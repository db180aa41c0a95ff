"""The WAL checkpoint's two-slot layout (wal/checkpoint.py): written in place, one slot at
a time, so a crash at any byte of a write leaves the checkpoint before it or the one it
wrote, never a mix and never none; bit rot of one slot falls back to the other; and a
write that raises ``first_offset`` leaves no slot that still asks for what it removes."""
from __future__ import annotations

import json
import os
import random

import pytest

from tests.wal.helpers import payload_for, small_config
from wal import CorruptLog, WalClosed, WriteAheadLog
from wal.checkpoint import CHECKPOINT_NAME, SLOT_BYTES, SLOT_MAGIC, read_checkpoint, write_checkpoint
from wal.testing import FaultFs

DIRECTORY = "/d"
PATH = os.path.join(DIRECTORY, CHECKPOINT_NAME)


def _state(n: int) -> dict[str, object]:
    return {"topic": "ns/t", "first_offset": n, "sealed_next_offset": 10 * n, "next_offset": 10 * n + 5}


def _fs() -> FaultFs:
    fs = FaultFs()
    fs.makedirs(DIRECTORY)
    return fs


def _read(fs: FaultFs) -> dict[str, object] | None:
    state = read_checkpoint(fs, DIRECTORY)
    if state is not None:
        state = {k: v for k, v in state.items() if k != "version"}
    return state


def _flip(fs: FaultFs, position: int) -> None:
    data = bytearray(fs.read_all(PATH))
    data[position] ^= 0x40
    handle = fs.open_rw(PATH)
    handle.pwrite([bytes(data)], 0)
    handle.sync()
    handle.close()


def _write_cut(fs: FaultFs, state: dict[str, object], both_slots: bool = False, syncs_ok: int = 0) -> None:
    """Write ``state`` in place, but the power goes before its ``syncs_ok + 1``-th sync
    returns (the sync fails, so that write stays in the page cache only)."""
    fs.fail_sync_after = fs.sync_calls + syncs_ok
    with pytest.raises(OSError):
        write_checkpoint(fs, DIRECTORY, state, in_place=True, both_slots=both_slots)
    fs.fail_sync_after = None


def _newest_slot(fs: FaultFs) -> int:
    data = fs.read_all(PATH)
    sequences = [int.from_bytes(data[i * SLOT_BYTES + 8:i * SLOT_BYTES + 16], "little") for i in (0, 1)]
    return sequences.index(max(sequences))


def test_writes_go_in_place_and_the_newest_is_read():
    fs = _fs()
    write_checkpoint(fs, DIRECTORY, _state(1), in_place=True)
    assert fs.file_size(PATH) == 2 * SLOT_BYTES
    renames = []
    real_rename = fs.rename
    fs.rename = lambda src, dst: (renames.append(dst), real_rename(src, dst))  # type: ignore[method-assign]
    for n in range(2, 12):
        write_checkpoint(fs, DIRECTORY, _state(n), in_place=True)
        assert _read(fs) == _state(n)
        assert fs.file_size(PATH) == 2 * SLOT_BYTES
    assert renames == [], "an in-place write creates and renames nothing"


def test_a_whole_file_checkpoint_is_read_and_converted_by_the_first_in_place_write():
    fs = _fs()
    write_checkpoint(fs, DIRECTORY, _state(1))  # the layout before format 2 (and the journal's)
    assert json.loads(fs.read_all(PATH))["crc32c"]
    assert _read(fs) == _state(1)
    write_checkpoint(fs, DIRECTORY, _state(2), in_place=True)
    assert fs.read_all(PATH)[:len(SLOT_MAGIC)] == SLOT_MAGIC and _read(fs) == _state(2)
    # A newly created slotted file holds the state in both slots: either one can rot.
    _flip(fs, 100)
    assert _read(fs) == _state(2)


@pytest.mark.parametrize("seed", range(40))
def test_a_crash_at_any_byte_of_a_write_leaves_the_old_or_the_new_checkpoint(seed):
    """Each write is cut by a power loss before its sync returned: torn at a random byte
    (the rest garbage, or the old bytes), or its pages persisted in any order. The
    checkpoint read back is the last one whose write returned, or the one being written;
    never a mix, never unreadable. The next write after such a crash works from what is
    there."""
    rng = random.Random(seed)
    fs = _fs()
    write_checkpoint(fs, DIRECTORY, _state(0), in_place=True)
    done = 0
    for n in range(1, 25):
        both = rng.random() < 0.3
        if rng.random() < 0.3:  # the write returns: it is the checkpoint now
            write_checkpoint(fs, DIRECTORY, _state(n), in_place=True, both_slots=both)
            assert _read(fs) == _state(n)
            done = n
            continue
        _write_cut(fs, _state(n), both, syncs_ok=rng.randrange(2) if both else 0)
        if rng.random() < 0.5:
            # Mostly inside the slot's header and body (about 100 bytes here), else anywhere;
            # the garbage stays in the slot written (a power loss damages only sectors it
            # was writing: wal/checkpoint.py).
            torn = rng.randrange(0, 160) if rng.random() < 0.8 else rng.randrange(0, SLOT_BYTES + 1)
            garbage = rng.randbytes(min(rng.randrange(0, 64), SLOT_BYTES - torn))
            crashed = fs.crash_image(torn_bytes=torn, garbage=garbage)
        else:
            crashed = fs.random_crash_image(rng)
        seen = _read(crashed)
        assert seen in (_state(done), _state(n)), (n, done, seen)
        if seen == _state(n):
            done = n
        fs = crashed


def test_a_torn_write_is_not_taken_and_the_next_write_replaces_it():
    fs = _fs()
    write_checkpoint(fs, DIRECTORY, _state(1), in_place=True)
    write_checkpoint(fs, DIRECTORY, _state(2), in_place=True)
    before = _newest_slot(fs)
    _write_cut(fs, _state(3))
    crashed = fs.crash_image(torn_bytes=40, garbage=b"\xff" * 7)  # header whole, body cut
    assert _read(crashed) == _state(2)
    write_checkpoint(crashed, DIRECTORY, _state(4), in_place=True)
    assert _read(crashed) == _state(4) and _newest_slot(crashed) != before


def test_rot_of_the_newest_slot_falls_back_to_the_other_and_of_both_is_no_checkpoint():
    fs = _fs()
    for n in range(1, 4):
        write_checkpoint(fs, DIRECTORY, _state(n), in_place=True)
    newest = _newest_slot(fs)
    _flip(fs, newest * SLOT_BYTES + 30)  # inside the body
    assert _read(fs) == _state(2)
    _flip(fs, (1 - newest) * SLOT_BYTES + 12)  # inside the other's sequence
    assert _read(fs) is None  # advisory, as an unreadable whole-file checkpoint


def test_both_slots_leaves_no_older_state():
    fs = _fs()
    for n in range(1, 4):
        write_checkpoint(fs, DIRECTORY, _state(n), in_place=True)
    write_checkpoint(fs, DIRECTORY, _state(4), in_place=True, both_slots=True)
    for slot in (0, 1):
        rotted = fs.process_crash_image()
        _flip(rotted, slot * SLOT_BYTES + 30)
        assert _read(rotted) == _state(4)


@pytest.mark.parametrize("damage", ["huge length", "last sequence", "magic only", "short"])
def test_hostile_slotted_files_are_unreadable_or_replaced_never_an_untyped_error(damage):
    fs = _fs()
    write_checkpoint(fs, DIRECTORY, _state(1), in_place=True)
    data = bytearray(fs.read_all(PATH))
    if damage == "huge length":
        data[16:20] = (2**32 - 1).to_bytes(4, "little")
    elif damage == "last sequence":  # a valid slot whose sequence cannot grow
        from wal.checkpoint import _slot
        body = json.dumps({"version": 1, **_state(7)}, sort_keys=True).encode()
        data[:SLOT_BYTES] = _slot(2**64 - 1, body)
    elif damage == "magic only":
        data[:] = (SLOT_MAGIC + bytes(SLOT_BYTES - len(SLOT_MAGIC))) * 2
    else:
        data = data[:SLOT_BYTES + 100]
    fs.remove(PATH)
    handle = fs.open_append(PATH)
    handle.write([bytes(data)])
    handle.sync()
    handle.close()
    read_checkpoint(fs, DIRECTORY)  # no exception
    write_checkpoint(fs, DIRECTORY, _state(9), in_place=True)
    assert _read(fs) == _state(9)


def test_a_wal_whose_newest_checkpoint_slot_rotted_after_retention_still_opens():
    """Retention records the new first offset before it unlinks the segments below it. Had
    it written one slot only, the other would still retain from 0, and a rotted newest
    slot would make the WAL refuse to open ("oldest segments missing?") over segments that
    retention removed on purpose."""
    fs = FaultFs()
    wal = WriteAheadLog.open("/r", "ns/t", small_config(segment_bytes_max=512), fs=fs)
    for i in range(60):
        wal.append(payload_for(i))
        wal.flush()  # a round each: the segments rotate
    segments = wal.segments()
    assert len(segments) > 3
    assert wal.truncate_before(segments[-1].base_offset) == len(segments) - 1
    crashed = fs.process_crash_image()  # the process dies: no close, no later checkpoint
    directory = "/r/ns/t"
    data = crashed.read_all(os.path.join(directory, CHECKPOINT_NAME))
    sequences = [int.from_bytes(data[i * SLOT_BYTES + 8:i * SLOT_BYTES + 16], "little") for i in (0, 1)]
    newest = sequences.index(max(sequences))
    rotted = bytearray(data)
    rotted[newest * SLOT_BYTES + 30] ^= 0x40
    crashed.remove(os.path.join(directory, CHECKPOINT_NAME))
    handle = crashed.open_append(os.path.join(directory, CHECKPOINT_NAME))
    handle.write([bytes(rotted)])
    handle.sync()
    handle.close()
    try:
        reopened = WriteAheadLog.open("/r", "ns/t", small_config(segment_bytes_max=512), fs=crashed)
    except CorruptLog as exc:  # pragma: no cover - the failure this test guards against
        pytest.fail(f"refused after retention: {exc}")
    assert reopened.first_offset == segments[-1].base_offset and reopened.next_offset == 60
    reopened.close()
    wal.close()


def _put(fs: FaultFs, data: bytes) -> None:
    if fs.exists(PATH):
        fs.remove(PATH)
    handle = fs.open_append(PATH)
    handle.write([data])
    handle.sync()
    handle.close()
    fs.fsync_dir(DIRECTORY)


def test_a_newest_slot_this_release_cannot_read_is_skipped_by_reader_and_writer_alike():
    """A CRC-valid slot with a body of another version (a later release) or hostile values
    is not the checkpoint: the reader takes the other slot, and the next write goes over
    the unreadable one, never over the slot a reader falls back to (atk68 F3)."""
    from wal.checkpoint import _slot

    fs = _fs()
    write_checkpoint(fs, DIRECTORY, _state(1), in_place=True)
    write_checkpoint(fs, DIRECTORY, _state(2), in_place=True)
    data = bytearray(fs.read_all(PATH))
    newest = _newest_slot(fs)
    data[newest * SLOT_BYTES:(newest + 1) * SLOT_BYTES] = _slot(99, json.dumps({"version": 7, **_state(5)}).encode())
    _put(fs, bytes(data))
    assert _read(fs) == _state(1)  # the older slot
    _write_cut(fs, _state(3))  # torn: must not have touched the slot holding _state(1)
    assert _read(fs.crash_image(torn_bytes=30, garbage=b"\x00" * 5)) == _state(1)


@pytest.mark.parametrize("value", ["abc", 1e400, -1, 2**63, True, None, [1], {"a": 1}])
@pytest.mark.parametrize("layout", ["slots", "whole file"])
def test_hostile_offsets_read_as_no_checkpoint_and_the_wal_opens(value, layout):
    """A CRC-valid checkpoint whose offsets are not whole numbers (hostile or a later
    release's) is unreadable, as a garbled one: the WAL opens, nothing lost, never an
    untyped error out of recovery's int() (atk68 F5)."""
    from wal.checkpoint import _slot
    from native import crc32c

    fs = FaultFs()
    wal = WriteAheadLog.open("/r", "ns/t", small_config(), fs=fs)
    for i in range(5):
        wal.append(payload_for(i))
    wal.close()
    body = json.dumps({"version": 1, "topic": "ns/t", "first_offset": 0, "sealed_next_offset": 0,
                       "next_offset": value}).encode()
    blob = (_slot(1, body) + _slot(2, body) if layout == "slots"
            else json.dumps({"crc32c": crc32c(body), "body": body.decode()}).encode())
    path = "/r/ns/t/" + CHECKPOINT_NAME
    fs.remove(path)
    handle = fs.open_append(path)
    handle.write([blob])
    handle.sync()
    handle.close()
    assert read_checkpoint(fs, "/r/ns/t") is None
    reopened = WriteAheadLog.open("/r", "ns/t", small_config(), fs=fs)
    assert reopened.next_offset == 5
    reopened.close()


def test_retention_on_a_closed_wal_is_refused_and_unlinks_nothing():
    """A closed WAL's files may belong to a newer instance by now (atk68 F6): retention
    through the old handle would unlink segments that one serves."""
    fs = FaultFs()
    config = small_config(segment_bytes_max=512)
    old = WriteAheadLog.open("/r", "ns/t", config, fs=fs)
    for i in range(30):
        old.append(payload_for(i))
        old.flush()
    segments = old.segments()
    old.close()
    newer = WriteAheadLog.open("/r", "ns/t", config, fs=fs)
    with pytest.raises(WalClosed):
        old.truncate_before(segments[-1].base_offset)
    assert [s.path for s in newer.segments()] == [s.path for s in segments]
    assert all(fs.exists(s.path) for s in segments)
    newer.close()
