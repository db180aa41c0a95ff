"""Prometheus metrics of a WAL.

Each WAL gets its own CollectorRegistry unless one is passed in; metric families are
created once per registry and labelled by topic, so many WALs can share one registry
(``BrokerHost`` passes its own to every WAL it opens) without "Duplicated timeseries"
errors.

Cardinality: a registry is either *per topic* (the default) or *aggregated*
(:func:`set_per_topic`). Per topic, every series carries ``topic="<the topic>"`` and is
removed when the last WAL of that topic in the registry closes, so the series count
follows the topics open now, not every topic ever opened. Aggregated, counters and
histograms of every topic add up in one series labelled ``topic="_all"`` and per-topic
gauges (durable offset, reader lag) are not exported; ``dnb_wal_failed`` then counts the
open WALs that failed. The ``tiered`` layers apply the same rule to their per-topic
families (see ``docs/METRICS.md``).

The append hot path never touches a metric: the writer thread adds whole batches after
each fsync, because a prometheus Counter.inc() per message would cost more than the
append itself.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
_RECORDS_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)

#: The ``topic`` label value every topic shares in an aggregated registry.
ALL_TOPICS = "_all"

_families_lock = threading.Lock()
_per_topic: "weakref.WeakKeyDictionary[CollectorRegistry, bool]" = weakref.WeakKeyDictionary()


def set_per_topic(registry: CollectorRegistry, on: bool) -> None:
    """Choose whether ``registry`` gets one series per topic (True, the default) or one
    aggregated series per family (False). Set it before the first metric is made there."""
    with _families_lock:
        _per_topic[registry] = on


def per_topic(registry: CollectorRegistry) -> bool:
    """Whether ``registry`` labels series by their own topic (see :func:`set_per_topic`)."""
    with _families_lock:
        return _per_topic.get(registry, True)


def topic_label(registry: CollectorRegistry, topic: str) -> str:
    """The ``topic`` label value of a counter or histogram series in ``registry``."""
    return topic if per_topic(registry) else ALL_TOPICS


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
    #: label value -> WALs open with it (series are removed when it drops to 0).
    users: dict[str, int] = field(default_factory=dict)

    def all(self) -> tuple[Counter | Gauge | Histogram, ...]:
        return (self.appends, self.bytes, self.fsyncs, self.fsync_seconds, self.records_per_fsync,
                self.durable_offset, self.reader_lag, self.segments, self.failed)


_made_lock = threading.Lock()
#: registry -> {make: make(registry)}; each value is of the type its ``make`` returns.
_made: "weakref.WeakKeyDictionary[CollectorRegistry, dict[Callable[[CollectorRegistry], object], object]]" = (
    weakref.WeakKeyDictionary())

F = TypeVar("F")


def families_for(registry: CollectorRegistry, make: Callable[[CollectorRegistry], F]) -> F:
    """``make(registry)``'s result, made once per (registry, make) pair: many owners may
    share one registry without prometheus_client's "Duplicated timeseries" error. Every
    metrics class of the project (this module's and ``tiered``'s) builds its families here."""
    with _made_lock:
        per_registry = _made.setdefault(registry, {})
        families = per_registry.get(make)
        if families is None:
            families = per_registry[make] = make(registry)
        return cast(F, families)  # stored under its own ``make``, so of the type it returns


def _families_for(registry: CollectorRegistry) -> _Families:
    return families_for(registry, _make_families)


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
        failed=Gauge("dnb_wal_failed", "1 once the WAL has failed closed (aggregated: failed open WALs)",
                     label, registry=registry),
    )


class WalMetrics:
    def __init__(self, topic: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._per_topic = per_topic(self.registry)
        self._label = topic if self._per_topic else ALL_TOPICS
        families = self._families = _families_for(self.registry)
        with _families_lock:
            families.users[self._label] = families.users.get(self._label, 0) + 1
        label = self._label
        self.appends = families.appends.labels(label)
        self.bytes = families.bytes.labels(label)
        self.fsyncs = families.fsyncs.labels(label)
        self.fsync_seconds = families.fsync_seconds.labels(label)
        self.records_per_fsync = families.records_per_fsync.labels(label)
        self.segments = families.segments.labels(label)
        self.failed = families.failed.labels(label)
        if self._per_topic:
            self.durable_offset = families.durable_offset.labels(label)
            self.reader_lag = families.reader_lag.labels(label)
        else:  # per-topic gauges do not add up: kept (for the WAL's own use), not exported
            unexported = CollectorRegistry(auto_describe=False)
            self.durable_offset = Gauge("dnb_wal_durable_offset", "", registry=unexported)
            self.reader_lag = Gauge("dnb_wal_reader_lag_records", "", registry=unexported)
        self._failed = False
        self._closed = False

    def on_fsync(self, records: int, nbytes: int, seconds: float, durable_offset: int) -> None:
        self.appends.inc(records)
        self.bytes.inc(nbytes)
        self.fsyncs.inc()
        self.fsync_seconds.observe(seconds)
        self.records_per_fsync.observe(records)
        self.durable_offset.set(durable_offset)

    def track_reader_lag(self, lag_fn: Callable[[], float]) -> None:
        self.reader_lag.set_function(lag_fn)

    def on_failed(self) -> None:
        """The WAL failed closed (counted once)."""
        with _families_lock:
            if self._failed or self._closed:
                return
            self._failed = True
        if self._per_topic:
            self.failed.set(1)
        else:
            self.failed.inc()

    def close(self) -> None:
        """The WAL closed: its series go once no other open WAL in the registry uses them
        (aggregated, a failed WAL stops counting in ``dnb_wal_failed``)."""
        families = self._families
        with _families_lock:
            if self._closed:
                return
            self._closed = True
            left = families.users[self._label] = families.users[self._label] - 1
            if left == 0:
                del families.users[self._label]
        if left == 0:
            for family in families.all():
                try:
                    family.remove(self._label)
                except KeyError:
                    pass
        elif self._failed and not self._per_topic:
            self.failed.dec()


_TOPICS_BUCKETS = (1, 2, 4, 8, 16, 64, 256, 1024, 4096, 16384)
_CHECKPOINT_BUCKETS_S = (0.001, 0.005, 0.025, 0.1, 0.25, 1.0, 2.5, 10.0, 30.0)


@dataclass(frozen=True)
class _GroupFamilies:
    rounds: Counter
    sync_seconds: Histogram
    topics_per_round: Histogram
    journal_bytes: Counter
    checkpoints: Counter
    checkpoint_seconds: Histogram
    checkpoint_files: Counter
    replayed_rounds: Counter
    replay_seconds: Gauge


def _make_group_families(registry: CollectorRegistry) -> _GroupFamilies:
    return _GroupFamilies(
        rounds=Counter("dnb_wal_group_rounds", "Commit rounds of a WAL root's commit group (one sync each)",
                       registry=registry),
        sync_seconds=Histogram("dnb_wal_group_sync_seconds",
                               "The one sync of a round (journal fdatasync or syncfs)",
                               buckets=_FSYNC_BUCKETS_S, registry=registry),
        topics_per_round=Histogram("dnb_wal_group_topics_per_round", "Topics made durable by one round",
                                   buckets=_TOPICS_BUCKETS, registry=registry),
        journal_bytes=Counter("dnb_wal_journal_bytes", "Bytes appended to the shared journal", registry=registry),
        checkpoints=Counter("dnb_wal_journal_checkpoints",
                            "Journal checkpoints (segment files synced, journal recycled behind them)",
                            registry=registry),
        checkpoint_seconds=Histogram("dnb_wal_journal_checkpoint_seconds",
                                     "Time to sync a checkpoint's segment files and record it",
                                     buckets=_CHECKPOINT_BUCKETS_S, registry=registry),
        checkpoint_files=Counter("dnb_wal_journal_checkpoint_files",
                                 "Segment files synced by journal checkpoints", registry=registry),
        replayed_rounds=Counter("dnb_wal_journal_replayed_rounds",
                                "Journal rounds replayed into segments when the root opened", registry=registry),
        replay_seconds=Gauge("dnb_wal_journal_replay_seconds", "Duration of the last journal replay",
                             registry=registry),
    )


class GroupMetrics:
    """Metrics of a WAL root's commit group and its shared journal (no topic label: one
    group per root, one root per broker host). Counted per round, never per message."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        families = families_for(self.registry, _make_group_families)
        self.rounds = families.rounds
        self.sync_seconds = families.sync_seconds
        self.topics_per_round = families.topics_per_round
        self.journal_bytes = families.journal_bytes
        self.checkpoints = families.checkpoints
        self.checkpoint_seconds = families.checkpoint_seconds
        self.checkpoint_files = families.checkpoint_files
        self.replayed_rounds = families.replayed_rounds
        self.replay_seconds = families.replay_seconds

    def on_round(self, topics: int, sync_s: float, journal_bytes: int) -> None:
        self.rounds.inc()
        self.sync_seconds.observe(sync_s)
        self.topics_per_round.observe(topics)
        if journal_bytes:
            self.journal_bytes.inc(journal_bytes)

    def on_checkpoint(self, seconds: float, files: int) -> None:
        self.checkpoints.inc()
        self.checkpoint_seconds.observe(seconds)
        self.checkpoint_files.inc(files)

    def on_replay(self, rounds: int, seconds: float) -> None:
        self.replayed_rounds.inc(rounds)
        self.replay_seconds.set(seconds)
