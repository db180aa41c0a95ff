"""Broker load reports: each broker writes ``/cluster/load/<broker_id>`` every
``interval_s`` under its session lease (so a dead broker's report vanishes with its
registration).

What a report holds today: the hosted topics and, per topic, the message and byte rates
in since the last report (from the change of its next offset and of its WAL's
``dnb_wal_append_bytes``, keyed by ``(topic, epoch)`` so a topic that moved away and
back starts a new rate instead of a negative one; none in a topic's first interval) and
its subscription count; this process's CPU use (process CPU time over wall time, as a
percentage of the machine's cores) and the machine's memory use (``/proc/meminfo``).
Bytes out, connection counts and backlog are not measured yet (0).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict

from tiered.cluster import records
from tiered.errors import LeaseNotFound, StorageError
from tiered.logs import FailureLog
from tiered.metadata.base import MetadataStore

log = logging.getLogger(__name__)

REPORT_INTERVAL_S_DEFAULT = 30.0


def memory_pct() -> tuple[float, float]:
    """(used %, total bytes) of the machine; (0, 1) when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()[1:2]}
        total, available = info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
        return (100.0 * (total - available) / total if total else 0.0), float(max(total, 1))
    except (OSError, KeyError, ValueError, IndexError):
        return 0.0, 1.0


class LoadReporter:
    """Writes this broker's load report; :meth:`report_once` is one report (tests call
    it directly), the thread calls it every ``interval_s``."""

    def __init__(self, host, interval_s: float = REPORT_INTERVAL_S_DEFAULT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.host = host
        self.metadata: MetadataStore = host.metadata
        self.broker_id: str = host.broker_id
        self.interval_s = interval_s
        self.clock = clock
        self.seq = 0
        self._last_at: float | None = None
        self._last_cpu: float | None = None
        self._offsets: dict[tuple[str, int], int] = {}
        self._bytes: dict[tuple[str, int], float] = {}
        self._bytes_now: dict[tuple[str, int], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = FailureLog(log, f"broker {self.broker_id}: load report")

    def build(self) -> records.LoadReportRecord:
        now = self.clock()
        cpu_now = time.process_time()
        elapsed = None if self._last_at is None else now - self._last_at
        cores = float(os.cpu_count() or 1)
        cpu_pct = 0.0
        if elapsed and elapsed > 0 and self._last_cpu is not None:
            cpu_pct = min(100.0, max(0.0, 100.0 * (cpu_now - self._last_cpu) / elapsed / cores))
        offsets: dict[tuple[str, int], int] = {}
        topics = []
        for hosted in self.host.topics():
            name = str(hosted.topic)
            try:
                next_offset = hosted.next_offset
            except Exception:  # noqa: BLE001 - a topic closing under us reports no rate
                continue
            key = (name, hosted.token.epoch)
            written = _wal_bytes(hosted)
            offsets[key] = next_offset
            self._bytes_now[key] = written
            before = self._offsets.get(key)
            rate = (next_offset - before) / elapsed if before is not None and elapsed else 0.0
            bytes_before = self._bytes.get(key)
            byte_rate = (written - bytes_before) / elapsed if bytes_before is not None and elapsed else 0.0
            topics.append(asdict(records.TopicReport(name, hosted.token.epoch, msg_in_rate=max(rate, 0.0),
                                                     bytes_in_rate=max(byte_rate, 0.0),
                                                     subscriptions=float(_subscriptions(hosted)))))
        self._offsets = offsets
        self._bytes, self._bytes_now = self._bytes_now, {}
        self._last_at, self._last_cpu = now, cpu_now
        mem_pct, mem_bytes = memory_pct()
        self.seq += 1
        return records.LoadReportRecord(self.broker_id, self.seq, time.time(), cpu_pct, mem_pct, cores, mem_bytes,
                                        topics=topics)

    def report_once(self) -> bool:
        """Write one report under the current session lease; False if it did not land."""
        session = self.host.session
        if session is None or not session.lease_id:
            return False
        record = self.build()
        try:
            self.metadata.put(records.load_key(self.broker_id), records.encode(record), session.lease_id)
            self._failures.succeeded()
            return True
        except LeaseNotFound:
            return False  # the session is re-registering; the next report uses the new lease
        except StorageError as e:
            self._failures.failed(e, level=logging.INFO)
            return False

    def start(self) -> "LoadReporter":
        self.report_once()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"dnb-load-{self.broker_id}")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.report_once()


def _wal_bytes(hosted) -> float:
    """Bytes the topic's WAL wrote so far (its ``dnb_wal_append_bytes`` counter; 0 if the
    WAL keeps no metrics)."""
    try:
        return float(hosted.wal.metrics.bytes._value.get())
    except AttributeError:
        return 0.0


def _subscriptions(hosted) -> int:
    try:
        return len(hosted.subscriptions.subscriptions)
    except (AttributeError, TypeError):
        return 0
