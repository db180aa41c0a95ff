"""Spark by topic holds every object to its descriptor (size + content digest), without a
Spark session: planning (footers) and read_partition (blocks) are where bytes are read."""
from __future__ import annotations

import dataclasses

import pytest

from native.errors import CorruptObject
from tests.spark.archive_util import messages, object_bytes, write_archive
from tiered.metadata import open_metadata
from tiered.objects import open_objects
from tiered.spark import reading
from tiered.spark.options import parse_options
from tiered.spark.planning import plan

TOPIC = "/default/identity"
COUNT = 300


@pytest.fixture
def archive(tmp_path):
    produced = messages(COUNT)
    objects_url, metadata_url = f"file://{tmp_path}/objects", f"sqlite:///{tmp_path}/meta.db"
    with open_objects(objects_url) as objects, open_metadata(metadata_url) as metadata:
        keys = write_archive(objects, metadata, TOPIC, produced, [(0, COUNT - 1, "b", 1)], block_bytes=1024,
                              zstd_level=0)
    return {"objects": objects_url, "metadata": metadata_url, "key": keys[0], "produced": produced,
            "metrics": str(tmp_path / "m")}


def _rows(archive) -> list:
    opts = parse_options({"topic": TOPIC, "metadata": archive["metadata"], "objects": archive["objects"],
                          "metricsDir": archive["metrics"]})
    return [r for p in plan(opts, opts.bounds) for b in reading.read_partition(p) for r in b.to_pylist()]


def _replace(archive, data: bytes) -> None:
    with open_objects(archive["objects"]) as objects:
        objects.put(archive["key"], data)


def test_reads_the_committed_object(archive):
    assert len(_rows(archive)) == COUNT


def test_same_size_impostor_is_refused(archive):
    other = [dataclasses.replace(m, payload=m.payload.upper()) for m in archive["produced"]]
    impostor = object_bytes(TOPIC, other, block_bytes=1024, zstd_level=0)
    with open_objects(archive["objects"]) as objects:
        assert len(impostor) == objects.head(archive["key"]).size
    _replace(archive, impostor)
    with pytest.raises(CorruptObject) as info:
        _rows(archive)
    assert info.value.object_name == archive["key"]


def test_larger_impostor_is_refused(archive):
    bigger = object_bytes(TOPIC, messages(COUNT + 50), block_bytes=1024, zstd_level=0)
    _replace(archive, bigger)
    with pytest.raises(CorruptObject, match="descriptor says"):
        _rows(archive)
