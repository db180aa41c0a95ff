"""Power loss and fsync failure through the fault-injecting file layer (wal.testing.FaultFs)."""
from __future__ import annotations

import asyncio
import os
import random
import threading
import time

import pytest

from tests.wal.helpers import check_payload, payload_for, read_all, small_config
from wal import WalFailed, WriteAheadLog
from wal.testing import FaultFs

ROOT = "/wal"


def _wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.0005)


def _recovered_offsets(image: FaultFs, config) -> list[int]:
    log = WriteAheadLog.open(ROOT, "/ns/t", config, fs=image)
    try:
        records = read_all(log)
        offsets = [check_payload(r.payload)[0] for r in records]
        assert offsets == [r.offset for r in records] == list(range(log.next_offset))
        assert log.append(payload_for(log.next_offset)) == len(offsets), "offsets continue at last valid + 1"
        log.flush()
        return offsets
    finally:
        log.close()


@pytest.mark.parametrize("garbage", [b"", b"\x00" * 9, bytes(range(7, 40))])
def test_power_loss_tearing_the_last_write_at_every_byte_loses_nothing_durable(garbage):
    config = small_config(segment_bytes_max=1 << 20)
    fs = FaultFs()
    log = WriteAheadLog.open(ROOT, "/ns/t", config, fs=fs)
    for offset in range(10):
        log.append(payload_for(offset))
    log.flush()
    durable = log.durable_offset
    fs.hold_syncs()
    try:
        first = log.append_batch([payload_for(o) for o in range(10, 13)])
        assert first == 10
        log.append(payload_for(13))
        _wait_until(lambda: fs.syncs_waiting == 1)
        torn_max = fs.unsynced_bytes()
        assert torn_max > 0
        counts = set()
        for torn in range(torn_max + 1):
            offsets = _recovered_offsets(fs.crash_image(torn, garbage), config)
            assert offsets[:durable + 1] == list(range(durable + 1)), f"durable data lost at tear {torn}"
            counts.add(len(offsets))
        # Every prefix of the torn write was seen: from nothing unsynced kept to all of it.
        assert min(counts) == durable + 1 and max(counts) >= 13
    finally:
        fs.release_syncs()
    log.close()


def test_random_power_losses_during_rotation_keep_everything_reported_durable():
    config = small_config(segment_bytes_max=1500)
    fs = FaultFs()
    log = WriteAheadLog.open(ROOT, "/ns/t", config, fs=fs)
    reported = [-1]
    log.add_durable_listener(lambda offset: reported.__setitem__(0, offset))
    stop = threading.Event()

    def produce() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            base = log.next_offset
            if rng.random() < 0.5:
                assert log.append_batch([payload_for(base + i) for i in range(rng.randrange(1, 6))]) == base
            else:
                assert log.append(payload_for(base)) == base
            time.sleep(rng.random() * 0.0005)

    producer = threading.Thread(target=produce)
    producer.start()
    rng = random.Random(2)
    images = []
    try:
        for _ in range(40):
            time.sleep(rng.random() * 0.004)
            durable_before = reported[0]
            images.append((durable_before, fs.crash_image(rng.randrange(0, 300), os.urandom(rng.randrange(0, 20)))))
    finally:
        stop.set()
        producer.join(10)
        log.close()
    assert len(log.segments()) > 3, "the workload should have rotated segments"
    for durable_before, image in images:
        offsets = _recovered_offsets(image, config)
        assert len(offsets) >= durable_before + 1, "an offset reported durable was lost"


def test_failed_fsync_fails_closed_and_is_never_retried():
    fs = FaultFs()
    log = WriteAheadLog.open(ROOT, "/ns/t", small_config(), fs=fs)
    log.append(payload_for(0))
    log.flush()
    fs.fail_sync_after = fs.sync_calls  # the very next fsync fails
    log.append(payload_for(1))
    with pytest.raises(WalFailed):
        log.flush()
    assert log.failed and log.durable_offset == 0
    calls_after_failure = fs.sync_calls
    with pytest.raises(WalFailed):
        log.append(payload_for(2))
    with pytest.raises(WalFailed):
        log.append_batch([payload_for(2)])
    with pytest.raises(WalFailed):
        log.wait_durable(1, 1.0)
    assert log.wait_durable(0, 0.1) is True, "what was durable before the failure stays durable"

    async def waits() -> None:
        with pytest.raises(WalFailed):
            await log.wait_durable_async(1, 1.0)

    asyncio.run(waits())
    reader = log.reader(0)
    assert next(reader).offset == 0
    with pytest.raises(WalFailed):
        next(reader)  # a live reader must not hang on a dead WAL
    time.sleep(0.02)
    assert fs.sync_calls == calls_after_failure and fs.failed_sync_calls == 1, "fsync must not be retried"
    assert log.metrics.registry.get_sample_value("dnb_wal_failed", {"topic": "/ns/t"}) == 1
    log.close()
    fs.fail_sync_after = None
    offsets = _recovered_offsets(fs.crash_image(), small_config())
    assert offsets[0] == 0, "offset 0 was durable before the failure"


def test_failed_fsync_with_many_appending_threads_drops_nothing_silently():
    fs = FaultFs()
    log = WriteAheadLog.open(ROOT, "/ns/t", small_config(), fs=fs)
    fs.fail_sync_after = fs.sync_calls + 5
    outcomes: list = []

    def produce() -> None:
        for _ in range(300):
            try:
                offset = log.append(b"x")
            except WalFailed:
                outcomes.append("refused")
                return
            try:
                log.wait_durable(offset, 5)
                outcomes.append(("durable", offset))
            except WalFailed:
                outcomes.append(("failed", offset))

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert log.failed
    durable = log.durable_offset if log.durable_offset is not None else -1
    for outcome in outcomes:
        if isinstance(outcome, tuple):
            kind, offset = outcome
            assert (kind == "durable") == (offset <= durable), "every append is acknowledged or fails"
    log.close()


def test_power_loss_after_creating_a_new_namespace_keeps_what_was_reported_durable():
    """open() makes <root>/<ns>/<topic>: the namespace directory's own name lives in the
    root directory, which must be fsynced too, or a power loss drops the whole topic."""
    fs = FaultFs(strict_dirs=True)
    fs.makedirs(ROOT)
    fs.settle_dirs()  # the WAL root existed before; the namespace and topic are new
    log = WriteAheadLog.open(ROOT, "/ns/t", small_config(), fs=fs)
    for offset in range(5):
        log.append(payload_for(offset))
    log.flush()
    assert log.durable_offset == 4
    image = fs.crash_image()
    log.close()
    assert _recovered_offsets(image, small_config()) == list(range(5))
