"""Shared helpers of the lifecycle, move and watcher tests.

``Cluster`` is a set of brokers sharing one metadata store and one object store, each
with its own WAL directory (as on separate machines). Stores are either embedded
(SQLite + local directory) or real servers (etcd + moto over HTTP).
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle import BrokerHost
from tiered.metadata import open_metadata
from tiered.metadata.base import MetadataStore
from tiered.objects import open_objects
from tiered.objects.base import ObjectStore
from uploader.config import UploaderConfig

TOPIC = "/default/reliable_topic"

# Background uploads effectively off (tests upload explicitly or via archived acks),
# except the first pass over a WAL a load recovered: frames durable before the uploader
# started count as infinitely old, so that pass comes at the pool's next tick and takes
# everything durable by then. Short waits so failure tests stay fast, short lease so
# failover tests do not wait.
FAST_UPLOADER = UploaderConfig(interval_s=3600.0, drain_timeout_s=2.0, retry_attempts_max=2,
                               retry_backoff_s=0.01, retry_backoff_max_s=0.05, poll_interval_s=0.05)
FAST_BROKER = BrokerConfig(uploader=FAST_UPLOADER, session_ttl_s=2.0, progress_interval_s=0.1,
                           flush_timeout_s=5.0, produce_timeout_s=10.0,
                           close_timeout_s=5.0)


class Cluster:
    def __init__(self, root: str, metadata: MetadataStore, objects: ObjectStore,
                 config: BrokerConfig = FAST_BROKER) -> None:
        self.root = root
        self.metadata = metadata
        self.objects = objects
        self.config = config
        self.hosts: list[BrokerHost] = []

    def wal_root(self, broker_id: str) -> str:
        return os.path.join(self.root, f"wal-{broker_id}")

    def broker(self, broker_id: str, **overrides: Any) -> BrokerHost:
        config = replace(self.config, **overrides) if overrides else self.config
        host = BrokerHost(broker_id, self.wal_root(broker_id), self.metadata, self.objects, config)
        self.hosts.append(host)
        return host

    def on_disk(self, broker_id: str, disk: str, config: BrokerConfig | None = None) -> BrokerHost:
        """``broker_id`` with its WAL root on the data dir ``disk`` (one broker id may run
        on several, one after the other)."""
        host = BrokerHost(broker_id, os.path.join(self.root, disk), self.metadata, self.objects,
                          config or self.config)
        self.hosts.append(host)
        return host

    def close(self) -> None:
        for host in self.hosts:
            try:
                host.close(unload=False)  # teardown: no seals (fast; fenced topics cannot)
            except Exception:  # noqa: BLE001 - teardown must close the rest
                pass


def local_stores(root: str) -> tuple[MetadataStore, ObjectStore]:
    os.makedirs(os.path.join(root, "objects"), exist_ok=True)
    return open_metadata(f"sqlite:///{root}/metadata.db"), open_objects(f"file://{root}/objects")


def store_urls(request: pytest.FixtureRequest, kind: str, root: str) -> tuple[str, str]:
    """(metadata URL, objects URL) of one store kind: ``local`` (SQLite and a directory
    under ``root``) or ``etcd+s3`` (a fresh root on the session's real etcd, a prefix of a
    fresh bucket on moto over HTTP). ``root/objects`` is made either way."""
    os.makedirs(os.path.join(root, "objects"), exist_ok=True)
    if kind == "local":
        return f"sqlite:///{root}/shared.db", f"file://{root}/objects"
    assert kind == "etcd+s3", kind
    etcd = request.getfixturevalue("etcd_server")
    moto = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    return (f"{etcd.url}/t-{uuid.uuid4().hex[:12]}",
            f"s3://{bucket}/dnb?endpoint={moto.endpoint_url}&region=us-east-1")


def remote_stores(request: pytest.FixtureRequest) -> tuple[MetadataStore, ObjectStore]:
    metadata_url, objects_url = store_urls(request, "etcd+s3", "")
    return open_metadata(metadata_url), open_objects(objects_url)


def stores_of(request: pytest.FixtureRequest, kind: str, root: str) -> tuple[MetadataStore, ObjectStore]:
    """The stores of a ``local`` / ``etcd+s3`` fixture parameter (see ``store_urls``)."""
    return local_stores(root) if kind == "local" else remote_stores(request)


@pytest.fixture
def local_cluster(tmp_path) -> Iterator[Cluster]:
    metadata, objects = local_stores(str(tmp_path))
    cluster = Cluster(str(tmp_path), metadata, objects)
    yield cluster
    cluster.close()
    metadata.close()


@pytest.fixture(params=["local", "etcd+s3"])
def any_cluster(request, tmp_path) -> Iterator[Cluster]:
    """The embedded stores and the real servers, same test."""
    metadata, objects = stores_of(request, request.param, str(tmp_path))
    cluster = Cluster(str(tmp_path), metadata, objects)
    yield cluster
    cluster.close()
    metadata.close()


def produce_range(hosted: Any, start: int, end_inclusive: int, ack: str = "durable") -> list[int]:
    """Produce payloads ``m<offset>`` and check each lands on the offset it names."""
    offsets = []
    for expected in range(start, end_inclusive + 1):
        offset = hosted.produce(payload_for(expected), ack=ack)
        assert offset == expected, f"produced at {offset}, expected {expected}"
        offsets.append(offset)
    return offsets


def payload_for(offset: int) -> bytes:
    return f"m{offset}".encode()


def read_all(hosted_or_reader: Any, start: int, stop_after: int) -> list[Any]:
    """Read ``[start, stop_after]`` from a hosted topic's tiered reader (no live tail)."""
    reader = hosted_or_reader.create_reader(start, live=False)
    with reader:
        return [m for m in reader if m.offset <= stop_after]


def wal_files(cluster: Cluster, broker_id: str, topic: str = TOPIC) -> list[str]:
    path = os.path.join(cluster.wal_root(broker_id), *topic.strip("/").split("/"))
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def close_while_loading(host: BrokerHost, monkeypatch: Any, topic: str = TOPIC) -> dict[str, object]:
    """Start ``host.load(topic)``, hold it once its WAL is open (at the owner marker), close
    the host, and let the load go once close() has begun. Returns ``{"hosted": ...}`` or
    ``{"error": ...}``: what the load came to."""
    import threading

    gate, reached = threading.Event(), threading.Event()
    real = host.root.write_owner_marker

    def held(*args: Any, **kwargs: Any) -> Any:
        reached.set()
        gate.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(host.root, "write_owner_marker", held)
    result: dict[str, object] = {}

    def load() -> None:
        try:
            result["hosted"] = host.load(topic)
        except Exception as exc:  # noqa: BLE001 - the caller checks it
            result["error"] = exc

    loader = threading.Thread(target=load)
    loader.start()
    assert reached.wait(60), "the load never reached its WAL"
    threading.Thread(target=lambda: (host._closing.wait(60), gate.set())).start()
    host.close()
    loader.join(60)
    return result
