"""The WAL on its append core (native.AppendBuffer): the C method is what wal.append is,
backpressure stays bounded, the writer is woken without lost wake-ups, the cache keeps the
newest frames when one group commit holds many records, close loses no returned offset."""
from __future__ import annotations

import threading
import time

import pytest

import native
from tests.wal.helpers import read_all, small_config
from wal import WalClosed, WalTimeout, WriteAheadLog
from wal.testing import FaultFs


def test_append_resolves_to_the_core_bound_method(tmp_path):
    with WriteAheadLog.open(str(tmp_path), "/ns/t", small_config()) as wal:
        assert wal.append.__self__ is wal._core and wal.append_batch.__self__ is wal._core
        assert isinstance(wal._core, native.AppendBuffer)
        # Calls through the class keep the same contract.
        assert WriteAheadLog.append(wal, b"a", publish_time=1) == 0
        assert WriteAheadLog.append_batch(wal, [b"b"], publish_time=1) == 1
        assert wal.append(b"c", b"k", {"x": "y"}, 5) == 2
        wal.flush()
        assert [(r.offset, r.key, r.publish_time) for r in read_all(wal)] == [
            (0, None, 1), (1, None, 1), (2, b"k", 5)]


def test_idle_writer_is_woken_by_the_next_append(tmp_path):
    # The writer parks for up to 0.5 s when idle; a lost wake-up would show as ~0.5 s.
    with WriteAheadLog.open(str(tmp_path), "/ns/t", small_config()) as wal:
        for i in range(20):
            time.sleep(0.01)  # let the writer park
            started = time.monotonic()
            offset = wal.append(b"x%d" % i)
            assert wal.wait_durable(offset, 5)
            assert time.monotonic() - started < 0.3, f"append {i} waited for the idle timeout"


def test_a_lone_append_is_synced_at_once_not_after_the_interval(tmp_path):
    # A writer that waited for a timer between rounds (the removed fsync_interval_ms, up
    # to 10 s) would leave the second and third appends undurable far past these bounds.
    config = small_config()
    with WriteAheadLog.open(str(tmp_path), "/ns/t", config) as wal:
        for i in range(3):
            offset = wal.append(b"lone%d" % i)
            assert wal.wait_durable(offset, 8.0), f"append {i} waited for the fsync interval"


def test_appends_made_during_an_fsync_form_the_next_round(tmp_path):
    fs = FaultFs()
    wal = WriteAheadLog.open("/wal", "/ns/t", small_config(), fs=fs)
    rounds: list[int] = []
    wal.add_durable_listener(rounds.append)
    fs.hold_syncs()
    try:
        wal.append(b"first")  # taken at once; the writer sticks in its fsync
        deadline = time.monotonic() + 10
        while fs.syncs_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert fs.syncs_waiting == 1
        syncs_before = fs.sync_calls
        for i in range(9):
            wal.append(b"later%d" % i)
        assert wal.durable_offset is None
    finally:
        fs.release_syncs()
    wal.flush()
    assert rounds == [0, 9], "the nine appends made during the fsync are one round"
    assert fs.sync_calls - syncs_before == 2
    wal.close()


def test_backpressure_is_bounded_and_resumes(tmp_path):
    fs = FaultFs()
    config = small_config(max_message_bytes=1000, pending_bytes_max=4000, append_timeout_s=0.3)
    wal = WriteAheadLog.open("/wal", "/ns/t", config, fs=fs)
    wal.append(b"first")
    wal.flush()
    fs.hold_syncs()
    try:
        wal.append(b"x" * 900)  # the writer takes this one and sticks in fsync
        deadline = time.monotonic() + 5
        while fs.syncs_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert fs.syncs_waiting == 1
        for _ in range(5):  # 5 x 926 B: the last one crosses 4000 B pending
            wal.append(b"y" * 900)
        started = time.monotonic()
        with pytest.raises(WalTimeout):
            wal.append(b"z")
        assert 0.25 <= time.monotonic() - started < 3, "backpressure must wait, and only so long"
        assert wal.next_offset == 7, "a timed-out append uses no offset"
    finally:
        fs.release_syncs()
    assert wal.append(b"z") == 7  # the writer drained; room again
    wal.flush()
    assert [r.offset for r in read_all(wal)] == list(range(8))
    wal.close()


def test_close_releases_a_blocked_appender_with_walclosed(tmp_path):
    fs = FaultFs()
    config = small_config(max_message_bytes=1000, pending_bytes_max=2000, append_timeout_s=10,
                          close_timeout_s=5)
    wal = WriteAheadLog.open("/wal", "/ns/t", config, fs=fs)
    fs.hold_syncs()
    outcome = []

    def appender() -> None:
        try:
            for _ in range(10):
                wal.append(b"q" * 900)
        except WalClosed as exc:
            outcome.append(exc)

    thread = threading.Thread(target=appender)
    thread.start()
    deadline = time.monotonic() + 5
    while wal._room_waiters == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert wal._room_waiters == 1, "the appender should be blocked on backpressure"
    closer = threading.Thread(target=wal.close)
    closer.start()
    thread.join(5)
    assert not thread.is_alive() and len(outcome) == 1
    fs.release_syncs()
    closer.join(10)
    assert wal.closed


def test_cache_keeps_the_newest_frames_of_a_large_commit(tmp_path):
    config = small_config(cache_messages_max=64, cache_bytes_max=16 * 1024)
    with WriteAheadLog.open(str(tmp_path), "/ns/t", config) as wal:
        first = wal.append_batch([b"m%04d" % i for i in range(500)])
        wal.flush()
        assert wal._cache.messages == 64
        assert wal._cache_covers(first + 499) and wal._cache_covers(first + 436)
        assert not wal._cache_covers(first + 435)
        records = wal._read_records(first + 436, first + 499, 1 << 20)
        assert [r.payload for r in records] == [b"m%04d" % i for i in range(436, 500)]
        big = wal.append(b"B" * 20_000)  # larger than the cache's byte bound
        wal.flush()
        assert wal._cache.messages == 0 and not wal._cache_covers(big)
        assert read_all(wal, big)[0].payload == b"B" * 20_000


def test_close_loses_no_offset_an_append_returned(tmp_path):
    wal = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
    returned: list[list[int]] = [[] for _ in range(4)]
    started = threading.Barrier(5)

    def produce(sink: list) -> None:
        started.wait(5)
        try:
            while True:
                if len(sink) % 5 == 0:
                    first = wal.append_batch([b"b"] * 3)
                    sink.extend(range(first, first + 3))
                else:
                    sink.append(wal.append(b"s"))
        except WalClosed:
            return

    threads = [threading.Thread(target=produce, args=(s,)) for s in returned]
    for thread in threads:
        thread.start()
    started.wait(5)
    time.sleep(0.05)
    wal.close()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    offsets = sorted(o for sink in returned for o in sink)
    assert offsets == list(range(len(offsets))) and offsets, "offsets unique and contiguous"
    again = WriteAheadLog.open(str(tmp_path), "/ns/t", small_config())
    assert again.next_offset == len(offsets), "every returned offset is on disk, no more"
    assert [r.offset for r in read_all(again)] == offsets
    again.close()
