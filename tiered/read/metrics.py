"""Prometheus metrics of the read side (tiered and cloud readers, subscriptions).

Built from a registry the owner passes in (``BrokerHost`` passes its own); a reader
made without one counts into a fresh private registry. Nothing registers at import.
"""
from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from tiered.metrics import families_for


@dataclass(frozen=True)
class ReadMetrics:
    registry: CollectorRegistry
    cloud_gets: Counter
    cloud_bytes: Counter
    reads: Counter
    lag: Gauge
    cursor_clamps: Counter
    cursor_flushes: Counter
    acks: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> "ReadMetrics":
        """The read-side families in ``registry`` (a fresh registry when None)."""
        return families_for(registry if registry is not None else CollectorRegistry(), _make)


def _make(registry: CollectorRegistry) -> ReadMetrics:
    r = registry
    return ReadMetrics(
        registry=r,
        cloud_gets=Counter("dnb_cloud_gets_total", "Object-store GETs made by cloud readers", ["kind"], registry=r),
        cloud_bytes=Counter("dnb_cloud_bytes_total", "Bytes fetched from the object store by cloud readers",
                            registry=r),
        reads=Counter("dnb_reader_messages_total", "Messages served by tiered readers, by tier", ["tier"],
                      registry=r),
        lag=Gauge("dnb_reader_lag_offsets", "Offsets between a reader's position and the topic's next offset "
                  "(sampled)", ["topic"], registry=r),
        cursor_clamps=Counter("dnb_cursor_clamps_total",
                              "Cursors moved back at load because they pointed past where offsets continue", registry=r),
        cursor_flushes=Counter("dnb_cursor_flushes_total", "Cursor writes by outcome", ["outcome"], registry=r),
        acks=Counter("dnb_subscription_acks_total", "Acks that advanced a cursor", registry=r),
    )  # fmt: skip
