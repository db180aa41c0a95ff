"""Metric families created once per registry, never at import time.

Every ``tiered`` metrics object is built from a ``CollectorRegistry`` its owner passes
in (a fresh one when none is given); only a composition root (``BrokerHost``, the broker
process) chooses prometheus_client's process-wide ``REGISTRY``. Many owners may share one
registry: the families are made on the first request for that registry and reused after,
so a second owner does not hit prometheus_client's "Duplicated timeseries" error.
"""
from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# The once-per-registry rule lives with the lowest layer that keeps metrics (the WAL).
from wal.metrics import families_for as families_for
from wal.metrics import per_topic, topic_label

C = TypeVar("C", Counter, Histogram)


#: Stands in for a per-topic gauge series in an aggregated registry: set, never exported.
_UNEXPORTED_GAUGE = Gauge("dnb_unexported", "A per-topic gauge of an aggregated registry", registry=None)


def topic_counter(registry: CollectorRegistry, family: C, topic: object) -> C:
    """The series of ``topic`` in a ``topic``-labelled counter or histogram ``family`` of
    ``registry``: the topic's own when the registry is per topic, else the shared
    ``topic="_all"`` series (``wal.metrics.set_per_topic``; docs/METRICS.md)."""
    return family.labels(topic_label(registry, str(topic)))


def topic_gauge(registry: CollectorRegistry, family: Gauge, topic: object) -> Gauge:
    """The series of ``topic`` in a ``topic``-labelled gauge ``family`` of ``registry``;
    in an aggregated registry a series that is never exported (per-topic values such as
    offsets do not add up)."""
    return family.labels(str(topic)) if per_topic(registry) else _UNEXPORTED_GAUGE
