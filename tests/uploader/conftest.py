"""Fixtures for the uploader suite: stores (local dir + SQLite, moto + etcd), a topic with
an owner record (the fencing compares), and a factory for uploaders."""
from __future__ import annotations

import os
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator

import pytest

from tiered.metadata import keys
from tiered.metadata.base import MetadataStore, value_is
from tiered.metadata.testing.faults import FaultyMetadataStore
from tiered.metadata.sqlite import SqliteMetadataStore
from tiered.objects.testing.faults import FaultyObjectStore
from tiered.objects.local import LocalObjectStore
from uploader import Uploader, UploaderConfig, UploaderMetrics
from wal.topics import TopicName


def _install_object_format_stand_in() -> None:
    """Until native/object_format.py lands, a minimal stand-in keeps the suite runnable.

    It is loud on purpose (a warning in the session header) and disappears the moment
    the real module imports.
    """
    import native

    try:
        from native import object_format  # noqa: F401
        if hasattr(native.codec, "object_encode"):
            return
    except ImportError:
        pass
    import zstandard

    mod = types.ModuleType("native.object_format")

    def write_object(frames: bytes, *, topic: str, block_bytes: int, zstd_level: int, first_offset=None) -> bytes:
        body = zstandard.ZstdCompressor(level=zstd_level).compress(frames) if zstd_level else frames
        return b"DNB1STANDIN" + bytes([1 if zstd_level else 0]) + body

    def read_all_frames(data: bytes, object_name: str = "<memory>") -> bytes:
        from native.errors import CorruptObject

        if not data.startswith(b"DNB1STANDIN"):
            raise CorruptObject(object_name, 0, "bad magic")
        body = data[12:]
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 30) if data[11] else body

    mod.write_object = write_object
    mod.read_all_frames = read_all_frames
    mod.STAND_IN = True
    sys.modules["native.object_format"] = mod
    import native

    native.object_format = mod


_install_object_format_stand_in()


class Env:
    """One topic's stores, owner record and fencing, plus helpers the tests share."""

    def __init__(self, metadata: MetadataStore, objects, topic: TopicName) -> None:
        self.faulty_metadata = FaultyMetadataStore(metadata)
        self.faulty_objects = FaultyObjectStore(objects)
        self.metadata = self.faulty_metadata
        self.objects = self.faulty_objects
        self.raw_metadata = metadata
        self.raw_objects = objects
        self.topic = topic
        self.owner = keys.Ownership("1", 7, time.time())
        metadata.put(keys.owner_key(topic), self.owner.to_json())
        self.registry = _registry()
        self.metrics = UploaderMetrics(registry=self.registry)

    @property
    def fencing(self) -> list:
        return [value_is(keys.owner_key(self.topic), self.owner.to_json())]

    def take_over(self, broker_id: str = "2") -> None:
        """Another broker takes ownership (epoch + 1): our fencing compares now fail."""
        successor = self.owner.successor(broker_id)
        self.raw_metadata.put(keys.owner_key(self.topic), successor.to_json())

    def uploader(self, wal, committed_through: int | None = None, **config) -> Uploader:
        config.setdefault("retry_backoff_s", 0.001)
        config.setdefault("compression", "none")
        return Uploader(self.topic, wal, self.metadata, self.objects, broker_id=1,
                        fencing=self.fencing, config=UploaderConfig(**config),
                        committed_through=committed_through, metrics=self.metrics)


def _registry():
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


@pytest.fixture
def topic() -> TopicName:
    return TopicName.parse(f"/ns/t-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def local_env(tmp_path, topic) -> Iterator[Env]:
    metadata = SqliteMetadataStore(str(tmp_path / "meta.db"))
    objects = LocalObjectStore(str(tmp_path / "objects"))
    yield Env(metadata, objects, topic)
    metadata.close()


@pytest.fixture
def server_env(etcd_server, etcd_root, moto_server, s3_bucket, topic) -> Iterator[Env]:
    from tiered.metadata import open_metadata
    from tiered.objects import open_objects

    metadata = open_metadata(etcd_server.url + etcd_root)
    objects = open_objects(f"s3://{s3_bucket}/archive?endpoint={moto_server.endpoint_url}")
    yield Env(metadata, objects, topic)
    objects.close()
    metadata.close()


@pytest.fixture(params=["local", "servers"])
def env(request) -> Env:
    """Every behaviour test runs against local dir + SQLite and moto + real etcd."""
    return request.getfixturevalue("local_env" if request.param == "local" else "server_env")


def pytest_report_header(config) -> str:
    from native import object_format

    if getattr(object_format, "STAND_IN", False):
        return "uploader: native.object_format missing -> using the test STAND-IN format"
    return "uploader: native.object_format present"


@pytest.fixture
def make_env(tmp_path) -> Callable[[TopicName], Env]:
    def make(topic: TopicName) -> Env:
        return Env(SqliteMetadataStore(str(tmp_path / f"meta-{topic.name}.db")),
                   LocalObjectStore(str(tmp_path / "objects")), topic)
    return make


os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
