"""Broker load reports: each broker writes ``/cluster/load/<broker_id>`` every
``interval_s`` under its session lease (so a dead broker's report vanishes with its
registration).

What a report holds: the hosted topics and, per topic,

* the message rate in since the last report (from the change of its next offset);
* the byte rates in and out (from the change of the payload and key bytes appended to
  it and handed out by its readers, :attr:`HostedTopic.activity
  <tiered.lifecycle.activity.TopicActivity>`: counted per topic whatever
  ``broker.metrics_per_topic`` says, and at the append, not when the WAL writer syncs);
* its producers and consumers: the client connections that produced to or read from it
  during the interval (consumers at least the readers open now);
* its subscription count and backlog (``next offset − (cursor + 1)`` summed over its
  subscriptions open here);

rates keyed by ``(topic, epoch)`` so a topic that moved away and back starts a new
rate instead of a negative one (none in a topic's first interval). The broker's
``net_in_bps``/``net_out_bps`` are the sums of its topics' byte rates. Plus this
process's CPU use (process CPU time over wall time, as a percentage of the machine's
cores), the machine's memory use (``/proc/meminfo``), this process's disk reads and
writes per second (``/proc/self/io``), and the broker's network and disk capacity as
configured (``server.nic_bps``, ``server.disk_bps``; unknown when unset). The leader
smooths every one of these numbers (:mod:`tiered.cluster.smoothing`).
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


def disk_io_bytes() -> float | None:
    """Bytes this process read from and wrote to storage so far; None when unknown."""
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        return float(int(info["read_bytes"]) + int(info["write_bytes"]))
    except (OSError, KeyError, ValueError):
        return None


class LoadReporter:
    """Writes this broker's load report; :meth:`report_once` is one report (tests call
    it directly), the thread calls it every ``interval_s``."""

    def __init__(self, host, interval_s: float = REPORT_INTERVAL_S_DEFAULT,
                 clock: Callable[[], float] = time.monotonic, nic_bps: float | None = None,
                 disk_bps: float | None = None) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.nic_bps, self.disk_bps = nic_bps, disk_bps
        self._last_disk: float | None = None
        self.host = host
        self.metadata: MetadataStore = host.metadata
        self.broker_id: str = host.broker_id
        self.interval_s = interval_s
        self.clock = clock
        self.seq = 0
        self._last_at: float | None = None
        self._last_cpu: float | None = None
        #: (topic, epoch) → (next offset, bytes in, bytes out) at the last report.
        self._counters: dict[tuple[str, int], tuple[float, float, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = FailureLog(log, f"broker {self.broker_id}: load report")

    def build(self) -> records.LoadReportRecord:
        now = self.clock()
        cpu_now = time.process_time()
        elapsed = None if self._last_at is None else now - self._last_at
        cores = float(os.cpu_count() or 1)
        disk_now = disk_io_bytes()
        cpu_pct = disk_io_bps = 0.0
        if elapsed and elapsed > 0 and self._last_cpu is not None:
            cpu_pct = min(100.0, max(0.0, 100.0 * (cpu_now - self._last_cpu) / elapsed / cores))
        if elapsed and elapsed > 0 and disk_now is not None and self._last_disk is not None:
            disk_io_bps = max((disk_now - self._last_disk) / elapsed, 0.0)
        counters: dict[tuple[str, int], tuple[float, float, float]] = {}
        topics = []
        net_in = net_out = 0.0
        for hosted in self.host.topics():
            name = str(hosted.topic)
            try:
                next_offset = hosted.next_offset
                backlog = _backlog(hosted)
            except Exception:  # noqa: BLE001 - a topic closing under us reports no rate
                continue
            key = (name, hosted.token.epoch)
            now_counts = (float(next_offset), _bytes_in(hosted), _bytes_out(hosted))
            counters[key] = now_counts
            before = self._counters.get(key)
            rates = [0.0, 0.0, 0.0]
            if before is not None and elapsed:
                rates = [max((c - b) / elapsed, 0.0) for c, b in zip(now_counts, before)]
            producers, consumers = _connections(hosted)
            net_in += rates[1]
            net_out += rates[2]
            topics.append(asdict(records.TopicReport(
                name, hosted.token.epoch, msg_in_rate=rates[0], bytes_in_rate=rates[1], bytes_out_rate=rates[2],
                producers=float(producers), consumers=float(consumers),
                subscriptions=float(_subscriptions(hosted)), backlog=float(backlog))))
        self._counters = counters
        self._last_at, self._last_cpu, self._last_disk = now, cpu_now, disk_now
        mem_pct, mem_bytes = memory_pct()
        self.seq += 1
        return records.LoadReportRecord(self.broker_id, self.seq, time.time(), cpu_pct, mem_pct, cores, mem_bytes,
                                        net_in_bps=net_in, net_out_bps=net_out, topics=topics,
                                        disk_io_bps=disk_io_bps, nic_bps=self.nic_bps, disk_bps=self.disk_bps)

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


def _bytes_in(hosted) -> float:
    activity = getattr(hosted, "activity", None)
    return float(activity.bytes_in) if activity is not None else 0.0


def _bytes_out(hosted) -> float:
    activity = getattr(hosted, "activity", None)
    return float(activity.bytes_out) if activity is not None else 0.0


def _connections(hosted) -> tuple[int, int]:
    """(producers, consumers): connections seen since the last report; consumers at
    least the readers open now (a long poll or an in-process reader is one)."""
    activity = getattr(hosted, "activity", None)
    producers, consumers = activity.take_connections() if activity is not None else (0, 0)
    try:
        consumers = max(consumers, hosted.open_readers())
    except AttributeError:
        pass
    return producers, consumers


def _backlog(hosted) -> int:
    try:
        return int(hosted.backlog())
    except AttributeError:
        return 0


def _subscriptions(hosted) -> int:
    try:
        return len(hosted.subscriptions.subscriptions)
    except (AttributeError, TypeError):
        return 0
