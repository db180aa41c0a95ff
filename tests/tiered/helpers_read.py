"""Shared helpers for the read-side tests (reader, cloud reader, subscriptions).

Fixtures here are imported by the test modules that use them (not via a conftest, so
other tests in this folder are unaffected). ``backends`` runs a test twice: against the
embedded pair (SQLite + local directory) and against real servers (etcd + moto over HTTP).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tiered.metadata import open_metadata
from tiered.metadata.base import MetadataStore
from tiered.objects import open_objects
from tiered.objects.base import ObjectStore

TOPIC = "/default/reliable_topic"
WAIT_S = 5.0


@dataclass
class Backends:
    kind: str
    metadata: MetadataStore
    objects: ObjectStore


@pytest.fixture(params=["local", pytest.param("remote", marks=[pytest.mark.etcd, pytest.mark.s3])])
def backends(request, tmp_path) -> Iterator[Backends]:
    """SQLite + local directory, then real etcd + moto (S3 over HTTP)."""
    if request.param == "local":
        metadata = open_metadata(f"sqlite://{tmp_path}/metadata.db")
        objects = open_objects(f"file://{tmp_path}/objects")
    else:
        etcd = request.getfixturevalue("etcd_server")
        root = request.getfixturevalue("etcd_root")
        moto = request.getfixturevalue("moto_server")
        bucket = request.getfixturevalue("s3_bucket")
        metadata = open_metadata(f"{etcd.url}{root}")
        objects = open_objects(f"s3://{bucket}/archive?endpoint={moto.endpoint_url}")
    try:
        yield Backends(request.param, metadata, objects)
    finally:
        objects.close()
        metadata.close()


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S, what: str = "condition") -> None:
    """Poll ``predicate`` with a bound; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


# -- an in-memory WAL double -------------------------------------------------------
import asyncio  # noqa: E402
import threading  # noqa: E402

from native.format import Record  # noqa: E402
from wal.errors import OffsetBelowRetention  # noqa: E402


def record(offset: int) -> Record:
    """The deterministic record stored at ``offset`` in every read test."""
    attrs = {"n": str(offset)} if offset % 3 == 0 else {}
    key = None if offset % 2 else f"k{offset}".encode()
    return Record(offset, 1_700_000_000_000 + offset, key, attrs, f"payload-{offset}".encode() * (1 + offset % 5))


class MemoryWal:
    """The slice of the WAL API the reader uses, in memory: for ordering/handoff tests.

    ``reader(from_offset, live)`` replays ``[from_offset, next_offset)`` and, when live,
    waits (bounded, re-checking ``close``) for appends. ``trim(first)`` models retention.
    """

    POLL_S = 0.005

    def __init__(self, first_offset: int = 0) -> None:
        self.first_offset = first_offset
        self.next_offset = first_offset
        self._records: dict[int, Record] = {}
        self._cond = threading.Condition()
        self.readers_opened = 0

    @property
    def durable_offset(self) -> int:
        return self.next_offset - 1

    def append(self, count: int = 1) -> None:
        with self._cond:
            for _ in range(count):
                self._records[self.next_offset] = record(self.next_offset)
                self.next_offset += 1
            self._cond.notify_all()

    def trim(self, first_offset: int) -> None:
        with self._cond:
            for offset in range(self.first_offset, first_offset):
                self._records.pop(offset, None)
            self.first_offset = first_offset

    def reader(self, from_offset: int, live: bool = True) -> "MemoryWalReader":
        if from_offset < self.first_offset:
            raise OffsetBelowRetention(from_offset, self.first_offset)
        self.readers_opened += 1
        return MemoryWalReader(self, from_offset, live)


class MemoryWalReader:
    def __init__(self, wal: MemoryWal, position: int, live: bool) -> None:
        self.wal, self.position, self.live = wal, position, live
        self.closed = False

    def _poll(self, wait_s: float) -> Record | None | str:
        with self.wal._cond:
            if self.position < self.wal.first_offset:
                raise OffsetBelowRetention(self.position, self.wal.first_offset)
            if self.position < self.wal.next_offset:
                self.position += 1
                return self.wal._records[self.position - 1]
            if not self.live or self.closed:
                return "end"
            self.wal._cond.wait(wait_s)
            return None

    def __iter__(self):
        return self

    def __next__(self) -> Record:
        while True:
            item = self._poll(0.05)
            if item == "end":
                raise StopIteration
            if item is not None:
                return item

    def __aiter__(self):
        return self

    async def __anext__(self) -> Record:
        while True:
            item = self._poll(0)
            if item == "end":
                raise StopAsyncIteration
            if item is not None:
                return item
            await asyncio.sleep(MemoryWal.POLL_S)

    def close(self) -> None:
        self.closed = True


# -- archives made the way the uploader makes them ---------------------------------
import time as _time  # noqa: E402

import native  # noqa: E402
from tiered.archive.naming import object_key  # noqa: E402
from tiered.metadata import keys  # noqa: E402


def frames(start: int, end: int) -> bytes:
    """WAL frames for ``record(start..end)`` (inclusive)."""
    return native.encode_batch(start, [tuple(record(o))[1:] for o in range(start, end + 1)])


def archive(b: Backends, start: int, end: int, *, broker_id: str = "broker-a", epoch: int = 1,
            block_bytes: int = 512, topic: str = TOPIC, descriptor_end: int | None = None,
            mangle=None) -> tuple[str, bytes]:
    """Write a dnb1 object for ``start..end`` and commit its descriptor; returns (key, bytes).

    ``descriptor_end`` lets a test commit a descriptor that lies about the object;
    ``mangle(bytes) -> bytes`` damages the object before it is stored.
    """
    from native import object_format

    data = object_format.write_object(frames(start, end), topic=str(topic), block_bytes=block_bytes,
                                      zstd_level=0)
    digest = object_format.object_digest(data)  # what the uploader recorded, before any damage
    if mangle is not None:
        data = mangle(data)
    # A data- id names its range, and a descriptor whose id names another range is
    # malformed (never read): a lying descriptor gets an id that names no range.
    object_id = f"data-{start}-{end}" if descriptor_end is None else f"object-{start}-{end}"
    key = object_key(topic, start, object_id)
    info = b.objects.put(key, data)
    descriptor = keys.ObjectDescriptor(
        start_offset=start, end_offset=end if descriptor_end is None else descriptor_end,
        object_id=object_id, size=len(data), etag=info.etag, created_at=_time.time(),
        broker_id=broker_id, epoch=epoch, **digest._asdict())
    b.metadata.put(keys.descriptor_key(topic, start), descriptor.to_json())
    return key, data


def cursor_write_fails_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The next cursor write of any subscription manager fails (a metadata timeout); later
    ones work. Returns the cursors each write attempt carried, in order."""
    from tiered.read.errors import CursorWriteFailed
    from tiered.read.subscriptions import SubscriptionManager

    real, calls = SubscriptionManager._write_cursor, []

    def fails_once(self, which, cursor):  # type: ignore[no-untyped-def]
        calls.append(cursor)
        if len(calls) == 1:
            raise CursorWriteFailed("injected: a metadata timeout")
        return real(self, which, cursor)

    monkeypatch.setattr(SubscriptionManager, "_write_cursor", fails_once)
    return calls


#: Bound on every wait of the stall tests: generous, only there so a regression fails
#: instead of hanging (never a measure of how fast anything is).
STALL_HANG_GUARD_S = 60.0


class StallingObjects:
    """An object store whose GETs, once ``armed``, block until ``release`` is set: an S3
    endpoint that takes the connection and never answers. Everything else is the inner
    store's. ``wait_stalled()`` returns once a GET has begun to stall (one per GET)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.armed = False
        self.release = threading.Event()
        self._stalled = threading.Semaphore(0)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _stall(self) -> None:
        if self.armed and not self.release.is_set():
            self._stalled.release()
            self.release.wait(2 * STALL_HANG_GUARD_S)

    def wait_stalled(self) -> bool:
        return self._stalled.acquire(timeout=STALL_HANG_GUARD_S)

    def get(self, *args, **kwargs):
        self._stall()
        return self.inner.get(*args, **kwargs)

    def get_range(self, *args, **kwargs):
        self._stall()
        return self.inner.get_range(*args, **kwargs)

    def get_tail(self, *args, **kwargs):
        self._stall()
        return self.inner.get_tail(*args, **kwargs)
