"""Prometheus metrics of a broker host (load, unload, failover, fencing).

Built from the registry the host is given; nothing registers at import.
"""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tiered.metrics import families_for


@dataclass(frozen=True)
class LifecycleMetrics:
    registry: CollectorRegistry
    unarchived_on_failover: Gauge
    failovers: Counter
    quarantines: Counter
    quarantined_offsets: Counter
    fenced_topics: Counter
    revived_topics: Counter
    load_seconds: Histogram
    unload_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> "LifecycleMetrics":
        """The host's families in ``registry`` (a fresh registry when None)."""
        return families_for(registry if registry is not None else CollectorRegistry(), _make)


def _make(registry: CollectorRegistry) -> LifecycleMetrics:
    r = registry
    return LifecycleMetrics(
        registry=r,
        unarchived_on_failover=Gauge(
            "dnb_failover_unarchived_offsets",
            "At least this many offsets of a dead owner's WAL were never archived (last failover)",
            ["topic"], registry=r),
        failovers=Counter("dnb_failovers_total", "Loads of a topic whose previous owner died without sealing",
                          registry=r),
        quarantines=Counter("dnb_wal_quarantines_total",
                            "Stale local WALs quarantined because they held offsets never archived", ["topic"],
                            registry=r),
        quarantined_offsets=Counter("dnb_wal_quarantined_offsets_total",
                                    "Offsets held only by quarantined stale WALs (exactly the lost failover tails)",
                                    ["topic"], registry=r),
        fenced_topics=Counter("dnb_topics_fenced_total",
                              "Hosted topics that learned a newer owner exists and stopped acknowledging",
                              registry=r),
        revived_topics=Counter("dnb_topics_wal_reopened_total",
                               "Hosted topics whose WAL failed on its own and were reopened from their files",
                               registry=r),
        load_seconds=Histogram("dnb_topic_load_seconds", "Time to load (restore) a topic", registry=r),
        unload_seconds=Histogram("dnb_topic_unload_seconds", "Time to unload (seal) a topic", registry=r),
    )  # fmt: skip
