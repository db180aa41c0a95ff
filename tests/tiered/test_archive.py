"""tiered.archive: object keys, the descriptor chain pager and the checks of an object
against its descriptor, each in one place."""
from __future__ import annotations

import pytest

from native.errors import CorruptObject
from tests.tiered.helpers_read import TOPIC, Backends, archive, backends  # noqa: F401 (fixture)
from tiered.archive import fetch
from tiered.archive.chain import DescriptorChain
from tiered.archive.fetch import ObjectMismatch, ObjectPin
from tiered.archive.naming import (
    descriptor_object_key,
    key_start_offset,
    object_id_for,
    object_key,
    parse_object_key,
    range_key_prefix,
    topic_objects_prefix,
)
from tiered.errors import MalformedRecord
from tiered.metadata import keys
from wal.topics import TopicName

T = TopicName.parse(TOPIC)


# -- naming ------------------------------------------------------------------------------
def test_object_keys_are_built_and_parsed_by_one_scheme() -> None:
    object_id = object_id_for(10, 19, 3)
    key = object_key(T, 10, object_id)
    assert key == "default/reliable_topic/data-10-19-e3.dnb1"
    assert key.startswith(topic_objects_prefix(T)) and key.startswith(range_key_prefix(T, 10))
    name = parse_object_key(T, key)
    assert name is not None and (name.object_id, name.start_offset, name.end_offset, name.epoch) == (object_id, 10, 19, 3)
    nonce = object_key(T, 10, object_id_for(10, 19, 3, "beef"))
    assert parse_object_key(T, nonce).epoch == 3  # type: ignore[union-attr]
    # Every layout ever written still names its start offset (GC and verify of old archives).
    assert key_start_offset(T, object_key(T, 10, "data-10-19")) == 10
    assert key_start_offset(T, f"default/reliable_topic/{7:020d}-someid.dnb1") == 7
    assert parse_object_key(T, f"default/reliable_topic/{7:020d}-someid.dnb1") is None
    assert key_start_offset(T, "default/other/data-1-2.dnb1") is None
    with pytest.raises(ValueError):
        object_key(T, 11, object_id)  # the id names another range


# -- chain -------------------------------------------------------------------------------
@pytest.mark.parametrize("page_keys", [1, 2, 1000])
def test_the_chain_pages_in_offset_order(backends: Backends, page_keys: int) -> None:
    for start, end in [(0, 4), (5, 9), (10, 14), (15, 19), (20, 24)]:
        archive(backends, start, end)
    chain = DescriptorChain(backends.metadata, TOPIC, page_keys=page_keys)
    assert [(d.start_offset, d.end_offset) for d in chain] == [(0, 4), (5, 9), (10, 14), (15, 19), (20, 24)]
    assert chain.first().start_offset == 0  # type: ignore[union-attr]
    assert chain.last().end_offset == 24 and chain.next_offset() == 25  # type: ignore[union-attr]
    tip = chain.tip()
    assert tip.end_offset == 24 and tip.mod_revision > 0
    assert [d.start_offset for d in chain.covering(7, 15)] == [5, 10, 15]
    assert [d.start_offset for d in chain.covering(22)] == [20]
    after = keys.descriptor_key(TOPIC, 10)
    assert [d.start_offset for d, _ in chain.entries(start_after=after)] == [15, 20]


def test_an_empty_chain(backends: Backends) -> None:
    chain = DescriptorChain(backends.metadata, TOPIC)
    assert (chain.first(), chain.last(), chain.tip().descriptor, chain.next_offset()) == (None, None, None, 0)
    assert list(chain.covering(0, 10)) == []


def test_a_malformed_descriptor_is_never_skipped(backends: Backends) -> None:
    archive(backends, 0, 4)
    archive(backends, 5, 9)
    backends.metadata.put(keys.descriptor_key(TOPIC, 5), b"{not json")
    chain = DescriptorChain(backends.metadata, TOPIC)
    with pytest.raises(MalformedRecord):
        chain.tip()
    with pytest.raises(MalformedRecord):
        list(chain)
    assert chain.first().start_offset == 0  # type: ignore[union-attr]


def test_a_descriptor_under_another_offsets_key_is_malformed(backends: Backends) -> None:
    archive(backends, 0, 4)
    raw = backends.metadata.get(keys.descriptor_key(TOPIC, 0)).value
    backends.metadata.put(keys.descriptor_key(TOPIC, 7), raw)
    with pytest.raises(MalformedRecord):
        DescriptorChain(backends.metadata, TOPIC).last()


# -- fetch: an object held to its descriptor ---------------------------------------------
def _descriptor(b: Backends, start: int) -> keys.ObjectDescriptor:
    return DescriptorChain(b.metadata, TOPIC).covering(start, start).__next__()


def test_a_pinned_footer_and_its_blocks_are_read(backends: Backends) -> None:
    key, data = archive(backends, 0, 49, block_bytes=256)
    d = _descriptor(backends, 0)
    assert descriptor_object_key(TOPIC, d) == key
    footer = fetch.read_footer(backends.objects, key, d.size, ObjectPin.of(d))
    fetch.check_footer(key, footer, TOPIC, 0, 49)
    offsets = [r[0] for b in footer.blocks for r in fetch.block_records(key, data[b.position:b.end], b, ObjectPin.of(d))]
    assert offsets == list(range(50))
    assert fetch.read_whole_object(key, data, ObjectPin.of(d), TOPIC) == fetch.object_frames(data, key, TOPIC)


def test_another_object_under_the_key_is_a_mismatch(backends: Backends) -> None:
    key, data = archive(backends, 0, 19, block_bytes=256)
    d = _descriptor(backends, 0)
    pin = ObjectPin.of(d)
    with pytest.raises(ObjectMismatch) as info:
        fetch.read_whole_object(key, data + b"\0", pin, TOPIC)
    assert info.value.what == "size"
    other = ObjectPin(pin.size, pin.footer_crc32c ^ 1, pin.block_crc32c)
    with pytest.raises(ObjectMismatch) as info:
        fetch.read_footer(backends.objects, key, d.size, other)
    assert info.value.what == "digest"
    with pytest.raises(ObjectMismatch) as info:
        fetch.read_whole_object(key, data, other, TOPIC)
    assert info.value.what == "digest"
    footer = fetch.read_footer(backends.objects, key, d.size, pin)
    with pytest.raises(CorruptObject, match="topic"):
        fetch.check_footer(key, footer, "/default/other")
    with pytest.raises(CorruptObject, match="descriptor says"):
        fetch.check_footer(key, footer, TOPIC, 0, 20)
    block = footer.blocks[0]
    wrong = ObjectPin(pin.size, pin.footer_crc32c, f"{(pin.block_crc(0) or 0) ^ 1:08x}" + pin.block_crc32c[8:])
    with pytest.raises(CorruptObject, match="CRC32C"):
        fetch.block_records(key, data[block.position:block.end], block, wrong)
