"""Readers hold every archived object to its descriptor (size + content digest).

An object replaced after its commit — by a stale owner on a server that ignores
conditional puts, an operator, or a bug — must surface as ``CorruptArchive`` naming the
object, never as data. On both backends (local dir + SQLite, moto + etcd).
"""
from __future__ import annotations

import pytest

import native
from native import object_format
from tests.tiered.helpers_read import TOPIC, Backends, archive, backends, record  # noqa: F401 (fixture)
from tiered.errors import MalformedRecord
from tiered.metadata import keys
from tiered.read.cloud import CloudReader
from tiered.read.errors import CorruptArchive


def other_history(start: int, end: int, block_bytes: int = 512) -> bytes:
    """An object of the same topic, range, publish times and sizes, other payload bytes."""
    batch = []
    for o in range(start, end + 1):
        r = record(o)
        batch.append((r.publish_time, r.key, r.attributes, bytes(b ^ 0x20 for b in r.payload)))
    return object_format.write_object(native.encode_batch(start, batch), topic=TOPIC,
                                      block_bytes=block_bytes, zstd_level=0)


def read_all(b: Backends, start: int, end: int) -> list:
    with CloudReader(TOPIC, b.metadata, b.objects, start, end) as r:
        return list(r)


def test_same_size_impostor_from_another_history_is_refused(backends: Backends) -> None:
    key, real = archive(backends, 0, 39)
    impostor = other_history(0, 39)
    assert len(impostor) == len(real) and impostor != real
    # Same shape down to the footer: only the block CRCs tell the two apart.
    assert object_format.object_digest(impostor).footer_crc32c == object_format.object_digest(real).footer_crc32c
    backends.objects.put(key, impostor)
    with pytest.raises(CorruptArchive) as info:
        read_all(backends, 0, 39)
    assert info.value.object_key == key and "CRC32C" in info.value.reason


def test_impostor_is_refused_for_a_read_of_one_block(backends: Backends) -> None:
    key, _ = archive(backends, 0, 99, block_bytes=128)
    backends.objects.put(key, other_history(0, 99, block_bytes=128))
    with pytest.raises(CorruptArchive) as info:
        read_all(backends, 50, 50)
    assert info.value.object_key == key


def test_larger_impostor_is_corrupt_archive_not_a_codec_error(backends: Backends) -> None:
    key, real = archive(backends, 0, 19)
    bigger = other_history(0, 19) + b"\0" * 4096
    backends.objects.put(key, bigger)
    with pytest.raises(CorruptArchive) as info:
        read_all(backends, 0, 19)
    assert info.value.object_key == key and "bytes" in info.value.reason


def test_garbage_of_the_same_size_is_corrupt_archive(backends: Backends) -> None:
    key, real = archive(backends, 0, 19)
    backends.objects.put(key, bytes(range(256)) * (len(real) // 256) + b"\xff" * (len(real) % 256))
    with pytest.raises(CorruptArchive) as info:
        read_all(backends, 0, 19)
    assert info.value.object_key == key


def test_descriptor_without_digest_is_malformed_not_read(backends: Backends) -> None:
    archive(backends, 0, 9)
    key = keys.descriptor_key(TOPIC, 0)
    raw = backends.metadata.get(key).value
    backends.metadata.put(key, raw.replace(b'"footer_crc32c":', b'"footer_crc32c_was":'))
    with pytest.raises(MalformedRecord):
        read_all(backends, 0, 9)
