"""Shared helpers for WAL tests: deterministic payloads and whole-log reads."""
from __future__ import annotations

import hashlib
import struct
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from wal import WalConfig, WriteAheadLog

if TYPE_CHECKING:
    from wal.group import CommitGroup

_TAG = struct.Struct("<QI")


def payload_for(offset: int, round_id: int = 0, size: int | None = None) -> bytes:
    """A payload that names its offset and writer round, padded with a checkable digest."""
    head = _TAG.pack(offset, round_id)
    size = (offset * 37 + round_id) % 200 if size is None else size
    pad = hashlib.blake2b(head, digest_size=32).digest()
    return head + (pad * (size // 32 + 1))[:size]


def check_payload(payload: bytes) -> tuple[int, int]:
    """(offset, round_id) a payload claims; asserts its padding is intact."""
    offset, round_id = _TAG.unpack_from(payload, 0)
    assert payload == payload_for(offset, round_id, len(payload) - _TAG.size), f"payload of {offset} damaged"
    return offset, round_id


def read_all(wal: WriteAheadLog, from_offset: int | None = None) -> list:
    start = wal.first_offset if from_offset is None else from_offset
    with wal.reader(start, live=False) as reader:
        return list(reader)


def small_config(**overrides) -> WalConfig:
    base = dict(segment_bytes_max=4096, cache_messages_max=64,
                cache_bytes_max=16 * 1024, read_chunk_bytes=2048, index_interval_bytes=256)
    base.update(overrides)
    return WalConfig(**base)


# -- many topics in one commit group (tests/wal/test_wal_group.py, test_wal_journal.py) -------
GROUP_ROOT = "/wal"


def group_topic(index: int) -> str:
    return f"/ns/t{index}"


def wait_until(predicate: Callable[[], object], timeout_s: float = 60.0) -> None:
    """Poll ``predicate`` (an event that takes milliseconds); the bound is generous for a
    loaded machine and reaching it fails the test."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.0005)


class Acks:
    """Highest offset each topic's durable listener reported (what was acknowledged)."""

    def __init__(self, topics: int) -> None:
        self._lock = threading.Lock()
        self.highest = [-1] * topics

    def listener(self, index: int) -> Callable[[int], None]:
        def on_durable(offset: int) -> None:
            with self._lock:
                self.highest[index] = max(self.highest[index], offset)
        return on_durable

    def snapshot(self) -> list[int]:
        with self._lock:
            return list(self.highest)


def check_recovered(wal: WriteAheadLog, acked_through: int, appended: dict[int, bytes]) -> None:
    """Offsets contiguous from 0, nothing acknowledged lost, every offset its own message."""
    records = read_all(wal)
    assert [r.offset for r in records] == list(range(wal.next_offset)), f"{wal.topic}: offsets contiguous from 0"
    assert wal.next_offset >= acked_through + 1, f"{wal.topic}: acknowledged offset {acked_through} was lost"
    for record in records:
        check_payload(record.payload)
        assert record.payload == appended[record.offset], (
            f"{wal.topic}: offset {record.offset} holds a message never appended under it")


def open_in_group(fs: object, group: "CommitGroup | None", index: int, config: WalConfig,
                  acks: Acks | None = None) -> WriteAheadLog:
    """Topic ``index``'s WAL under GROUP_ROOT on ``fs``, in ``group`` (standalone if None)."""
    wal = WriteAheadLog.open(GROUP_ROOT, group_topic(index), config, fs=fs, group=group)  # type: ignore[arg-type]
    if acks is not None:
        wal.add_durable_listener(acks.listener(index))
    return wal


# -- memory budgets of a WAL root (test_wal_pending_budget.py, test_wal_budgets_own_writers.py)
BUDGET_MESSAGE = 1000  # payload bytes of the budget tests' messages; a frame is a little more


def budget_config(**overrides) -> WalConfig:
    """Topics of 1 MiB pending each: only the root's budget can hold them back."""
    base = dict(segment_bytes_max=1 << 20, max_message_bytes=4096, pending_bytes_max=1 << 20,
                append_timeout_s=600.0)
    base.update(overrides)
    return small_config(**base)


def fill_behind_a_held_sync(fs, budget, wal: WriteAheadLog) -> None:
    """Hold syncs, get ``wal``'s writer stuck in its sync, then append to ``wal`` until
    ``budget`` (a root's ``PendingBudget``) is full: the stuck writer takes nothing meanwhile."""
    fs.hold_syncs()
    wal.append(payload_for(wal.next_offset, size=BUDGET_MESSAGE))
    # At least one: a journal's checkpointer may have its first spare file's sync held too.
    wait_until(lambda: fs.syncs_waiting >= 1)
    while not budget.full:
        wal.append(payload_for(wal.next_offset, size=BUDGET_MESSAGE))


def append_in_thread(wal: WriteAheadLog, outcome: list[BaseException]) -> threading.Thread:
    """Start a thread appending one message to ``wal`` (it may wait for room); what it
    raises goes to ``outcome``."""
    def append() -> None:
        try:
            wal.append(payload_for(0, size=BUDGET_MESSAGE))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=append)
    thread.start()
    return thread


def run_as_writer_thread(work: Callable[[], object]) -> list[object]:
    """Run ``work`` on a thread marked as a WAL writer thread (as a durable listener runs,
    ``wal.budget.mark_writer_thread``) and wait for it: [what it returned] or [what it raised]."""
    from wal.budget import mark_writer_thread

    outcome: list[object] = []

    def run() -> None:
        mark_writer_thread()
        try:
            outcome.append(work())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "a writer thread's append waited"
    return outcome
