"""A host's registry holds its WALs' metrics (a scrape of it sees ``dnb_wal_*``), series
follow the hosted topics, and an aggregated registry keeps one series per family."""
from __future__ import annotations

from prometheus_client import CollectorRegistry

from tests.tiered.helpers_lifecycle import FAST_BROKER, TOPIC, local_stores
from tiered.lifecycle import BrokerHost

OTHER = "/default/other"


def _topics(registry: CollectorRegistry, family: str) -> set[str]:
    return {s.labels["topic"] for f in registry.collect() if f.name == family for s in f.samples}


def _host(tmp_path, registry: CollectorRegistry, **kwargs: object) -> tuple[BrokerHost, object]:
    metadata, objects = local_stores(str(tmp_path))
    return BrokerHost("A", str(tmp_path / "wal-A"), metadata, objects, FAST_BROKER,
                      metrics_registry=registry, **kwargs), metadata  # type: ignore[arg-type]


def test_the_hosts_registry_has_its_wals_metrics_while_they_are_hosted(tmp_path) -> None:
    registry = CollectorRegistry()
    host, metadata = _host(tmp_path, registry)
    try:
        host.load(TOPIC).produce(b"x")
        host.load(OTHER).produce(b"y")
        assert registry.get_sample_value("dnb_wal_appends_total", {"topic": TOPIC}) == 1
        assert registry.get_sample_value("dnb_wal_durable_offset", {"topic": OTHER}) == 0
        assert _topics(registry, "dnb_wal_fsyncs") == {TOPIC, OTHER}
        host.unload(OTHER)
        assert _topics(registry, "dnb_wal_fsyncs") == {TOPIC}, "a topic that left keeps no WAL series"
        assert _topics(registry, "dnb_uploader_lag_offsets") <= {TOPIC}
    finally:
        host.close(unload=False)
        metadata.close()  # type: ignore[attr-defined]


def test_an_aggregated_registry_sums_topics_and_exports_no_per_topic_gauge(tmp_path) -> None:
    registry = CollectorRegistry()
    host, metadata = _host(tmp_path, registry, metrics_per_topic=False)
    try:
        host.load(TOPIC).produce(b"x")
        other = host.load(OTHER)
        other.produce(b"y")
        other.produce(b"z")
        assert registry.get_sample_value("dnb_wal_appends_total", {"topic": "_all"}) == 3
        assert _topics(registry, "dnb_wal_appends") == {"_all"}
        assert _topics(registry, "dnb_wal_durable_offset") == set()
        assert _topics(registry, "dnb_uploader_lag_offsets") == set()
        host.unload(OTHER)
        assert registry.get_sample_value("dnb_wal_appends_total", {"topic": "_all"}) == 3, \
            "the shared series stays while a topic still uses it"
    finally:
        host.close(unload=False)
        metadata.close()  # type: ignore[attr-defined]


def test_the_config_key_chooses_the_cardinality_and_the_argument_overrides_it(tmp_path) -> None:
    from dataclasses import replace

    from tiered.config import load_config

    loaded = load_config(environ={"DNB_BROKER_METRICS_PER_TOPIC": "false"})
    assert loaded.config.broker_config().metrics_per_topic is False
    aggregated, per_topic = CollectorRegistry(), CollectorRegistry()
    config = replace(FAST_BROKER, metrics_per_topic=False)
    metadata, objects = local_stores(str(tmp_path))
    hosts = [BrokerHost("A", str(tmp_path / "wal-A"), metadata, objects, config, metrics_registry=aggregated),
             BrokerHost("B", str(tmp_path / "wal-B"), metadata, objects, config, metrics_registry=per_topic,
                        metrics_per_topic=True)]
    try:
        hosts[0].load(TOPIC).produce(b"x")
        hosts[1].load(OTHER).produce(b"y")
        assert _topics(aggregated, "dnb_wal_appends") == {"_all"}
        assert _topics(per_topic, "dnb_wal_appends") == {OTHER}
    finally:
        for host in hosts:
            host.close(unload=False)
        metadata.close()  # type: ignore[attr-defined]
