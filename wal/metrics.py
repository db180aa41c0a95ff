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
each fsync, and even that only to plain numbers (``_WalSeries``) that a collector turns
into families at scrape time: a prometheus ``inc``/``observe`` per topic per round cost
more than the rest of a commit group's round of that topic.
"""
from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

_FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)
_RECORDS_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
#: ``bisect_left(_RECORDS_BUCKETS, n)`` for every n up to 1,024, looked up instead of
#: searched: ``on_fsync`` runs for every topic of every commit round.
_RECORDS_BUCKET_OF = bytes(bisect_left(_RECORDS_BUCKETS, n) for n in range(1025))

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


class _WalSeries:
    """One WAL's counts, as plain numbers the writer thread adds to (no lock, no metric
    call per round: a prometheus ``inc``/``observe`` per topic per round cost more than a
    commit group's whole round of that topic). :class:`_WalCollector` turns them into
    metric families when the registry is scraped."""

    __slots__ = ("label", "appends", "bytes", "fsyncs", "fsync_sum", "fsync_buckets", "records_sum",
                 "records_buckets", "segments", "durable", "lag_fn", "failed")

    def __init__(self, label: str) -> None:
        self.label = label
        self.appends = 0
        self.bytes = 0
        self.fsyncs = 0
        self.fsync_sum = 0.0
        self.fsync_buckets = [0] * (len(_FSYNC_BUCKETS_S) + 1)
        self.records_sum = 0
        self.records_buckets = [0] * (len(_RECORDS_BUCKETS) + 1)
        self.segments = 0
        self.durable = -1
        self.lag_fn: Callable[[], float] | None = None
        self.failed = False

    def add(self, other: "_WalSeries") -> None:
        self.appends += other.appends
        self.bytes += other.bytes
        self.fsyncs += other.fsyncs
        self.fsync_sum += other.fsync_sum
        self.records_sum += other.records_sum
        self.segments += other.segments
        for i, n in enumerate(other.fsync_buckets):
            self.fsync_buckets[i] += n
        for i, n in enumerate(other.records_buckets):
            self.records_buckets[i] += n


def _copy(series: "_WalSeries | None") -> "_WalSeries | None":
    if series is None:
        return None
    copy = _WalSeries(series.label)
    copy.add(series)
    return copy


def _histogram(family: HistogramMetricFamily, label: str, bounds: tuple[float, ...], buckets: list[int],
               total: float) -> None:
    cumulative, running = [], 0
    for bound, count in zip((*map(float, bounds), float("inf")), buckets):
        running += count
        cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
    family.add_metric([label], cumulative, total)


class _WalCollector:
    """The WAL families of one registry, collected from the live WALs' :class:`_WalSeries`.

    Per topic, a label's series exist while a WAL with it is open (two WALs of one topic
    add up) and go when the last closes. Aggregated, every WAL counts into ``_all`` and the
    counts of closed WALs are kept, so counters never go down."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._lock = threading.Lock()
        self._live: dict[str, list[_WalSeries]] = {}
        self._retired: dict[str, _WalSeries] = {}  # counts of closed WALs, by label
        self._per_topic = per_topic(registry)
        registry.register(self)

    def describe(self) -> list[Metric]:
        return list(self._families())

    def add(self, series: _WalSeries) -> None:
        with self._lock:
            self._live.setdefault(series.label, []).append(series)

    def remove(self, series: _WalSeries) -> None:
        with self._lock:
            live = self._live[series.label]
            live.remove(series)
            if live:
                self._retired.setdefault(series.label, _WalSeries(series.label)).add(series)
            elif self._per_topic:
                del self._live[series.label]
                self._retired.pop(series.label, None)
            else:
                self._retired.setdefault(series.label, _WalSeries(series.label)).add(series)

    def collect(self) -> list[Metric]:
        with self._lock:
            labels = sorted(set(self._live) | set(self._retired))
            # The retired counts copied here, with the live list: a WAL closing during the
            # scrape moves from one to the other under this lock, never counted twice.
            groups = {label: (list(self._live.get(label, [])), _copy(self._retired.get(label)))
                      for label in labels}
        families = self._families()
        appends, nbytes, fsyncs, fsync_s, records, durable, lag, segments, failed = families
        for label, (live, retired) in groups.items():
            total = _WalSeries(label)
            for series in live:
                total.add(series)
            if retired is not None:
                total.add(retired)
            appends.add_metric([label], total.appends)
            nbytes.add_metric([label], total.bytes)
            fsyncs.add_metric([label], total.fsyncs)
            segments.add_metric([label], total.segments)
            _histogram(fsync_s, label, _FSYNC_BUCKETS_S, total.fsync_buckets, total.fsync_sum)
            _histogram(records, label, _RECORDS_BUCKETS, total.records_buckets, total.records_sum)
            if self._per_topic:
                if live:
                    durable.add_metric([label], max(s.durable for s in live))
                    lag.add_metric([label], max((s.lag_fn() if s.lag_fn else 0.0) for s in live))
                    failed.add_metric([label], 1 if any(s.failed for s in live) else 0)
            else:
                failed.add_metric([label], sum(1 for s in live if s.failed))
        return list(families)

    @staticmethod
    def _families() -> tuple[Any, ...]:
        label = ["topic"]
        return (
            CounterMetricFamily("dnb_wal_appends", "Records handed to the WAL writer", labels=label),
            CounterMetricFamily("dnb_wal_append_bytes", "Frame bytes written to segments", labels=label),
            CounterMetricFamily("dnb_wal_fsyncs", "fdatasync calls on segment files", labels=label),
            HistogramMetricFamily("dnb_wal_fsync_seconds", "fdatasync latency", labels=label),
            HistogramMetricFamily("dnb_wal_records_per_fsync", "Records made durable by one fsync", labels=label),
            GaugeMetricFamily("dnb_wal_durable_offset", "Last durable offset (-1: none)", labels=label),
            GaugeMetricFamily("dnb_wal_reader_lag_records",
                              "Durable records the slowest open reader has not consumed", labels=label),
            CounterMetricFamily("dnb_wal_segments_created", "Segment files created", labels=label),
            GaugeMetricFamily("dnb_wal_failed", "1 once the WAL has failed closed (aggregated: failed open WALs)",
                              labels=label),
        )


def _collector_for(registry: CollectorRegistry) -> _WalCollector:
    return families_for(registry, _WalCollector)


class WalMetrics:
    """One WAL's metrics (see the module docstring). Hot-path calls add to plain numbers."""

    def __init__(self, topic: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self._per_topic = per_topic(self.registry)
        self._series = _WalSeries(topic if self._per_topic else ALL_TOPICS)
        self._collector = _collector_for(self.registry)
        self._collector.add(self._series)
        self._closed = False
        self._state_lock = threading.Lock()

    def on_fsync(self, records: int, nbytes: int, seconds: float, durable_offset: int) -> None:
        """A round made ``records`` records durable (the writer thread only)."""
        series = self._series
        series.appends += records
        series.bytes += nbytes
        series.fsyncs += 1
        series.fsync_sum += seconds
        series.fsync_buckets[bisect_left(_FSYNC_BUCKETS_S, seconds)] += 1
        series.records_sum += records
        series.records_buckets[_RECORDS_BUCKET_OF[records] if records <= 1024
                               else bisect_left(_RECORDS_BUCKETS, records)] += 1
        series.durable = durable_offset

    def on_segment(self) -> None:
        self._series.segments += 1

    def set_durable(self, offset: int) -> None:
        self._series.durable = offset

    @property
    def append_bytes(self) -> int:
        """Frame bytes this WAL wrote so far (its share of ``dnb_wal_append_bytes``)."""
        return self._series.bytes

    def track_reader_lag(self, lag_fn: Callable[[], float]) -> None:
        self._series.lag_fn = lag_fn

    def on_failed(self) -> None:
        """The WAL failed closed (counted once)."""
        with self._state_lock:
            if self._closed:
                return
            self._series.failed = True

    def close(self) -> None:
        """The WAL closed: its series go once no other open WAL in the registry uses them
        (aggregated, its counts stay in ``_all`` and it stops counting as failed)."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._collector.remove(self._series)


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
    cache_bytes: Gauge
    cache_trimmed_bytes: Counter
    pending_bytes: Gauge


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
        cache_bytes=Gauge("dnb_wal_group_cache_bytes",
                          "Bytes the caches of the group's topics keep alive together (its cache budget; "
                          "with per-topic writers, the WAL root's)",
                          registry=registry),
        cache_trimmed_bytes=Counter("dnb_wal_group_cache_trimmed_bytes",
                                    "Bytes trimmed off topics' caches to keep the group's cache budget "
                                    "(still in the segment files)", registry=registry),
        pending_bytes=Gauge("dnb_wal_group_pending_bytes",
                            "Bytes the group's topics hold appended but not yet taken by a round (its "
                            "pending budget; with per-topic writers, the WAL root's), read when scraped, summed over the "
                            "roots of the registry", registry=registry),
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
        self.cache_bytes = families.cache_bytes
        self.cache_trimmed_bytes = families.cache_trimmed_bytes
        self.pending_bytes = families.pending_bytes

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
