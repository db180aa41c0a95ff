"""Prometheus metrics of a WAL.

Each WAL gets its own CollectorRegistry unless one is passed in; metric families are
created once per registry and labelled by topic, so many WALs can share one registry
(e.g. the process-wide default) without "Duplicated timeseries" errors.

The append hot path never touches a metric: the writer thread adds whole batches after
each fsync, because a prometheus Counter.inc() per message would cost more than the
append itself.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
_RECORDS_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)

_families_lock = threading.Lock()


@dataclass(frozen=True)
class _Families:
    """The metric families of one registry (each labelled by topic)."""

    appends: Counter
    bytes: Counter
    fsyncs: Counter
    fsync_seconds: Histogram
    records_per_fsync: Histogram
    durable_offset: Gauge
    reader_lag: Gauge
    segments: Counter
    failed: Gauge


_families: "weakref.WeakKeyDictionary[CollectorRegistry, _Families]" = weakref.WeakKeyDictionary()


def _families_for(registry: CollectorRegistry) -> _Families:
    with _families_lock:
        families = _families.get(registry)
        if families is None:
            families = _families[registry] = _make_families(registry)
        return families


def _make_families(registry: CollectorRegistry) -> _Families:
    label = ["topic"]
    return _Families(
        appends=Counter("dnb_wal_appends", "Records handed to the WAL writer", label, registry=registry),
        bytes=Counter("dnb_wal_append_bytes", "Frame bytes written to segments", label, registry=registry),
        fsyncs=Counter("dnb_wal_fsyncs", "fdatasync calls on segment files", label, registry=registry),
        fsync_seconds=Histogram("dnb_wal_fsync_seconds", "fdatasync latency", label,
                                buckets=_FSYNC_BUCKETS_S, registry=registry),
        records_per_fsync=Histogram("dnb_wal_records_per_fsync", "Records made durable by one fsync",
                                    label, buckets=_RECORDS_BUCKETS, registry=registry),
        durable_offset=Gauge("dnb_wal_durable_offset", "Last durable offset (-1: none)", label,
                             registry=registry),
        reader_lag=Gauge("dnb_wal_reader_lag_records",
                         "Durable records the slowest open reader has not consumed", label,
                         registry=registry),
        segments=Counter("dnb_wal_segments_created", "Segment files created", label, registry=registry),
        failed=Gauge("dnb_wal_failed", "1 once the WAL has failed closed", label, registry=registry),
    )


class WalMetrics:
    def __init__(self, topic: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        families = _families_for(self.registry)
        self.appends = families.appends.labels(topic)
        self.bytes = families.bytes.labels(topic)
        self.fsyncs = families.fsyncs.labels(topic)
        self.fsync_seconds = families.fsync_seconds.labels(topic)
        self.records_per_fsync = families.records_per_fsync.labels(topic)
        self.durable_offset = families.durable_offset.labels(topic)
        self.reader_lag = families.reader_lag.labels(topic)
        self.segments = families.segments.labels(topic)
        self.failed = families.failed.labels(topic)

    def on_fsync(self, records: int, nbytes: int, seconds: float, durable_offset: int) -> None:
        self.appends.inc(records)
        self.bytes.inc(nbytes)
        self.fsyncs.inc()
        self.fsync_seconds.observe(seconds)
        self.records_per_fsync.observe(records)
        self.durable_offset.set(durable_offset)

    def track_reader_lag(self, lag_fn: Callable[[], float]) -> None:
        self.reader_lag.set_function(lag_fn)
