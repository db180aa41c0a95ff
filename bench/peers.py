"""The peer stores the WAL benchmarks compare against, and the device floors beside them.

Each peer stores messages of many topics in ONE database (the topic is a key prefix) and
makes a batch of them durable with ONE sync, which is the policy of the WAL's group commit:

* ``rocksdict`` (RocksDB): key = topic (4 bytes, big-endian) + offset (8 bytes); one
  ``WriteBatch`` per batch, written without sync, then ``flush_wal(sync=True)``, one
  fdatasync of RocksDB's own WAL. Not ``write(batch, sync=True)``: ``Rdict.write`` holds
  the GIL for the whole call, sync included, so a writer thread would stop every other
  Python thread (the producer) for each sync; ``flush_wal`` releases it. Alone, both cost
  the same (one fdatasync).
* ``sqlite``: ``journal_mode=WAL``, ``synchronous=FULL``, one table ``(key INTEGER PRIMARY
  KEY, payload)`` with key = topic << 40 | offset (a rowid table, SQLite's fastest; a
  composite ``(topic, offset)`` key WITHOUT ROWID measured 20-30 % slower, much more so
  with 64 KiB rows); one transaction per batch (``executemany``), so one fsync of
  SQLite's WAL per commit.
* ``lmdb``: one environment, ``sync=True, metasync=True``; one write transaction per batch
  (``putmulti``), synced on commit.

``bench_wal.py`` feeds them closed-loop batches; ``bench_latency.py`` feeds them an
open-loop stream through ``PeerGroup`` (below), which takes whatever the producer queued
since the last round, as ``wal.group.CommitGroup`` does. ``write_batch`` is called from one
thread at a time (the caller's, or the group's).

The floors: ``fdatasync_floor`` (4 KiB write + fdatasync in a loop, in Python) and
``fio_write_sync`` (fio's sequential writes with an fdatasync every N blocks).
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

#: One message of a batch: (topic index, offset, payload).
Row = tuple[int, int, bytes]

_KEY = struct.Struct(">IQ")  # topic, offset: keys of a topic are contiguous and in offset order


class PeerStore(Protocol):
    name: str

    def write_batch(self, rows: Sequence[Row]) -> None:
        """Store ``rows`` and return once all of them are durable (one sync)."""

    def close(self) -> None: ...


class RocksdictPeer:
    name = "rocksdict"

    def __init__(self, path: str) -> None:
        from rocksdict import Options, Rdict, WriteOptions
        self._db = Rdict(path, Options(raw_mode=True))
        self._no_sync = WriteOptions()
        self._no_sync.sync = False  # made durable by flush_wal(True) below, outside the GIL

    def write_batch(self, rows: Sequence[Row]) -> None:
        from rocksdict import WriteBatch
        batch = WriteBatch(raw_mode=True)
        put, pack = batch.put, _KEY.pack
        for topic, offset, payload in rows:
            put(pack(topic, offset), payload)
        self._db.write(batch, self._no_sync)
        self._db.flush_wal(True)

    def close(self) -> None:
        self._db.close()


class SqlitePeer:
    name = "sqlite"

    def __init__(self, path: str) -> None:
        # check_same_thread=False: opened on the caller's thread, written by a group's thread
        # (one at a time, never concurrently).
        self._db = sqlite3.connect(os.path.join(path, "db.sqlite"), isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("CREATE TABLE m (key INTEGER PRIMARY KEY, payload BLOB)")

    def write_batch(self, rows: Sequence[Row]) -> None:
        self._db.execute("BEGIN")
        self._db.executemany("INSERT INTO m VALUES (?, ?)",
                             [(topic << 40 | offset, payload) for topic, offset, payload in rows])
        self._db.execute("COMMIT")

    def close(self) -> None:
        self._db.close()


class LmdbPeer:
    name = "lmdb"

    def __init__(self, path: str, map_bytes: int, ascending_keys: bool = False) -> None:
        """``ascending_keys``: every batch's keys come in ascending order, above all earlier
        ones (a single topic in offset order), so LMDB may append instead of searching."""
        import lmdb
        self._env = lmdb.open(path, map_size=max(1 << 30, map_bytes), sync=True, metasync=True)
        self._append = ascending_keys

    def write_batch(self, rows: Sequence[Row]) -> None:
        pack = _KEY.pack
        with self._env.begin(write=True) as txn:
            txn.cursor().putmulti([(pack(topic, offset), payload) for topic, offset, payload in rows],
                                  append=self._append)

    def close(self) -> None:
        self._env.close()


PEERS = ("rocksdict", "sqlite", "lmdb")


def open_peer(name: str, path: str, map_bytes: int, ascending_keys: bool = False) -> PeerStore:
    """Peer ``name`` in the (new, empty) directory ``path``. ``map_bytes``: the most data the
    run will write (LMDB's map must hold it); ``ascending_keys``: see ``LmdbPeer``."""
    os.makedirs(path, exist_ok=True)
    if name == "rocksdict":
        return RocksdictPeer(path)
    if name == "sqlite":
        return SqlitePeer(path)
    if name == "lmdb":
        return LmdbPeer(path, map_bytes, ascending_keys)
    raise ValueError(f"unknown peer {name!r} (one of {', '.join(PEERS)})")


class PeerGroup:
    """T topics over one peer store, committed like ``wal.group.CommitGroup`` commits WALs.

    ``append(topic)(payload)`` gives the message the topic's next offset (0, 1, ...) and
    queues it; one writer thread takes EVERYTHING queued since its last round as one batch
    (all topics), makes it durable with the peer's one sync, then calls each topic's
    listener once with the topic's last offset in the batch (as a WAL's durable listener
    is called once per round). An idle writer is woken by the next append; nothing waits
    for a timer. Appends block while ``pending_bytes_max`` payload bytes are queued and
    not yet taken (the WAL's backpressure bound, ``WalConfig.pending_bytes_max``), for at
    most ``append_timeout_s``.
    """

    def __init__(self, store: PeerStore, listeners: Sequence[Callable[[int], None]],
                 pending_bytes_max: int, append_timeout_s: float = 30.0) -> None:
        self._store = store
        self._listeners = list(listeners)
        self._pending_bytes_max = pending_bytes_max
        self._append_timeout_s = append_timeout_s
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._rows: list[Row] = []
        self._pending_bytes = 0
        self._next = [0] * len(self._listeners)  # each topic's next offset
        self._durable_next = [0] * len(self._listeners)
        self._writing = False
        self._stopping = False
        self._failure: BaseException | None = None
        self.syncs = 0
        self._thread = threading.Thread(target=self._run, name=f"peer-group:{store.name}", daemon=True)
        self._thread.start()

    def append(self, topic: int) -> Callable[[bytes], int]:
        """Topic ``topic``'s append function: ``append(payload) -> offset``."""
        lock, work, next_offset = self._lock, self._work, self._next

        def append(payload: bytes) -> int:
            with lock:
                if self._pending_bytes >= self._pending_bytes_max:
                    self._wait_for_room()
                offset = next_offset[topic]
                next_offset[topic] = offset + 1
                self._rows.append((topic, offset, payload))  # self._rows: swapped every round
                self._pending_bytes += len(payload)
                if not self._writing:
                    work.notify()
            return offset

        return append

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + self._append_timeout_s
        while self._pending_bytes >= self._pending_bytes_max and self._failure is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self._store.name}: append blocked {self._append_timeout_s} s "
                                   "on a full queue")
            self._room.wait(remaining)
        if self._failure is not None:
            raise RuntimeError(f"{self._store.name} writer failed") from self._failure

    def _run(self) -> None:
        try:
            while (rows := self._take()) is not None:
                self._store.write_batch(rows)
                self.syncs += 1
                last = {topic: offset for topic, offset, _ in rows}  # rows of a topic are in offset order
                for topic, offset in last.items():
                    assert offset >= self._durable_next[topic], "durable offsets must not go back"
                    self._durable_next[topic] = offset + 1
                    self._listeners[topic](offset)
        except BaseException as exc:  # noqa: BLE001 - kept for drain() and append() to raise
            with self._lock:
                self._failure = exc
                self._room.notify_all()
                self._idle.notify_all()

    def _take(self) -> list[Row] | None:
        """Everything queued (blocks while nothing is), or None to stop."""
        with self._lock:
            self._writing = False
            self._idle.notify_all()  # drain() waits for an idle writer with nothing queued
            while not self._rows:
                if self._stopping:
                    return None
                self._work.wait()
            rows, self._rows = self._rows, []
            self._pending_bytes = 0
            self._writing = True
            self._room.notify_all()
            return rows

    def drain(self, timeout_s: float) -> None:
        """Returns once everything appended before the call is durable."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while (self._rows or self._writing) and self._failure is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self._store.name}: drain did not finish in {timeout_s} s")
                self._idle.wait(remaining)
            if self._failure is not None:
                raise RuntimeError(f"{self._store.name} writer failed") from self._failure
        assert self._durable_next == self._next, "every appended offset must be durable after a drain"

    def close(self, timeout_s: float = 60.0) -> None:
        with self._lock:
            self._stopping = True
            self._work.notify_all()
        self._thread.join(timeout_s)
        self._store.close()


def fdatasync_floor(directory: str, count: int = 300) -> list[float]:
    """Seconds per 4 KiB write + fdatasync of one file, ``count`` times in a row."""
    path = os.path.join(directory, "floor.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = b"\0" * 4096
    samples = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            samples.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.remove(path)
    return samples


def fio_write_sync(directory: str, block: str, size_mb: int, blocks_per_sync: int = 1) -> dict:
    """fio sequential writes of ``block`` (e.g. ``4k``, ``1M``) with an fdatasync every
    ``blocks_per_sync`` blocks, ``size_mb`` in all: throughput, IOPS and fdatasync latency
    percentiles (ms), and the command. Needs the ``fio`` binary (``shutil.which``)."""
    path = os.path.join(directory, "fio.dat")
    command = ["fio", "--name=seqwrite", f"--filename={path}", "--rw=write", f"--bs={block}",
               f"--size={size_mb}M", f"--fdatasync={blocks_per_sync}", "--ioengine=sync",
               "--end_fsync=1", "--output-format=json"]
    try:
        out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300).stdout
    finally:
        if os.path.exists(path):
            os.remove(path)
    job = json.loads(out[out.index("{"):])["jobs"][0]
    sync_pct = job.get("sync", {}).get("lat_ns", {}).get("percentile", {})
    return {"mb_per_s": job["write"]["bw_bytes"] / 1e6, "iops": job["write"]["iops"],
            "sync_p50_ms": sync_pct.get("50.000000", float("nan")) / 1e6,
            "sync_p99_ms": sync_pct.get("99.000000", float("nan")) / 1e6,
            "command": " ".join(command)}


def fio_available() -> bool:
    return shutil.which("fio") is not None
