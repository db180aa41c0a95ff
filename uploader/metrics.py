"""Prometheus metrics of the uploader.

Per-topic gauges (lag) carry a ``topic`` label and are removed when the topic's uploader
stops, so a broker that hosted thousands of topics over time does not keep their series.
Object size and latency histograms are broker-wide to keep cardinality bounded.
"""
from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from tiered.metrics import families_for

_SIZE_BUCKETS_BYTES = tuple(float(1 << n) for n in range(10, 28, 2))  # 1 KiB .. 128 MiB
_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

#: Failure kinds counted in ``dnb_uploader_failures_total``.
FAILURE_KINDS = ("read", "put", "commit", "conflict", "ownership", "unavailable", "gap", "other")


class UploaderMetrics:
    """The uploader's metric families in one registry."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self.lag_offsets = Gauge(
            "dnb_uploader_lag_offsets", "Durable offsets not yet in a committed object",
            ["topic"], registry=registry)
        self.lag_bytes = Gauge(
            "dnb_uploader_lag_bytes", "Estimated durable frame bytes not yet in a committed object",
            ["topic"], registry=registry)
        self.object_bytes = Histogram(
            "dnb_uploader_object_bytes", "Size of uploaded dnb1 objects",
            buckets=_SIZE_BUCKETS_BYTES, registry=registry)
        self.upload_seconds = Histogram(
            "dnb_uploader_upload_seconds", "Time from reading frames to a committed descriptor",
            buckets=_LATENCY_BUCKETS_S, registry=registry)
        self.failures = Counter(
            "dnb_uploader_failures", "Failed upload steps by kind", ["kind"], registry=registry)
        self.objects = Counter(
            "dnb_uploader_objects", "Committed objects by how they were stored",
            ["how"], registry=registry)  # fmt: skip
        self.cuts = Counter(
            "dnb_uploader_cuts", "Committed objects by why they were cut: size (full), age "
            "(oldest frame reached object_age_max_s), forced (archived waiter, request, drain)",
            ["reason"], registry=registry)
        self.frame_bytes = Counter(
            "dnb_uploader_frame_bytes", "Frame bytes archived (before compression)", registry=registry)

        self.retention_cuts = Counter(
            "dnb_archive_retention_cuts", "Archive retention cuts (start raised), by the limit that "
            "removed the first object: age or bytes", ["reason"], registry=registry)
        self.retention_descriptors = Counter(
            "dnb_archive_retention_descriptors_deleted", "Descriptors deleted below the archive start",
            registry=registry)
        self.retention_objects = Counter(
            "dnb_archive_retention_objects_deleted", "Archive objects deleted by retention (not by orphan GC)",
            registry=registry)
        self.retention_bytes = Counter(
            "dnb_archive_retention_bytes_deleted", "Bytes of archive objects deleted by retention",
            registry=registry)
        self.retention_refused = Counter(
            "dnb_archive_retention_refused", "Retention runs that cut nothing although a limit asked for it: "
            "fenced (not the owner), broken_chain (a gap or overlap above the start), conflict, "
            "past_committed", ["kind"], registry=registry)

    @classmethod
    def create(cls, registry: CollectorRegistry) -> "UploaderMetrics":
        """The families in ``registry``, made once per registry and shared by every
        uploader handed it (a second ``UploaderMetrics(registry)`` would be refused as
        a duplicate)."""
        return families_for(registry, cls)

    def forget_topic(self, topic: str) -> None:
        for gauge in (self.lag_offsets, self.lag_bytes):
            try:
                gauge.remove(topic)
            except KeyError:
                pass


def default_metrics() -> UploaderMetrics:
    """The process-wide metrics in the default registry (created on first use)."""
    return UploaderMetrics.create(REGISTRY)
