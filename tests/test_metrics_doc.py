"""docs/METRICS.md lists exactly the metrics the code makes: every metrics class is built
into a fresh registry and its families (scrape name, type, labels) must equal the rows
of the page's tables."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from tiered.cluster.metrics import LoadManagerMetrics
from tiered.lifecycle.metrics import LifecycleMetrics
from tiered.objects.s3 import S3ObjectStore
from tiered.read.metrics import ReadMetrics
from uploader.metrics import UploaderMetrics
from wal.heap import HeapMetrics
from wal.metrics import GroupMetrics, WalMetrics

DOC = Path(__file__).resolve().parent.parent / "docs" / "METRICS.md"
ROW = re.compile(r"^\| `(dnb_[a-z0-9_]+)` \| (counter|gauge|histogram) \| ([^|]*) \|", re.MULTILINE)

_S3_CLIENT = SimpleNamespace(meta=SimpleNamespace(endpoint_url="http://127.0.0.1:1"))  # never called

BUILDERS: list[Callable[[CollectorRegistry], object]] = [
    lambda r: WalMetrics("/ns/t", r),
    GroupMetrics,
    HeapMetrics,
    UploaderMetrics.create,
    LifecycleMetrics.create,
    ReadMetrics.create,
    LoadManagerMetrics,
    lambda r: S3ObjectStore("bucket", client=_S3_CLIENT, metrics_registry=r),
]


def _made() -> set[tuple[str, str, tuple[str, ...]]]:
    families: set[tuple[str, str, tuple[str, ...]]] = set()
    for build in BUILDERS:
        registry = CollectorRegistry()
        build(registry)
        for collector in list(registry._collector_to_names):  # the families, labelled or not
            if hasattr(collector, "_name"):  # a prometheus_client metric
                name = collector._name + ("_total" if collector._type == "counter" else "")
                families.add((name, collector._type, tuple(collector._labelnames)))
                continue
            # A collector of our own (wal.metrics' WAL families): its families as scraped.
            for family in collector.collect():
                name = family.name + ("_total" if family.type == "counter" else "")
                labels = {k for sample in family.samples for k in sample.labels if k != "le"}
                families.add((name, family.type, tuple(sorted(labels))))
    return families


def _documented() -> set[tuple[str, str, tuple[str, ...]]]:
    rows = ROW.findall(DOC.read_text())
    assert len(rows) == len({name for name, _, _ in rows}), "a metric is listed twice"
    return {(name, kind, tuple(re.findall(r"`([a-z_]+)`", labels))) for name, kind, labels in rows}


def test_metrics_doc_lists_every_metric_with_its_type_and_labels() -> None:
    made, documented = _made(), _documented()
    assert made - documented == set(), "made but not in docs/METRICS.md"
    assert documented - made == set(), "in docs/METRICS.md but not made"


def test_every_topic_labelled_family_is_marked_per_topic() -> None:
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match and "`topic`" in match.group(3):
            assert line.rstrip().endswith("*(per topic)* |"), line
