"""The descriptor chain in metadata: extend it by one fenced transaction.

A topic's descriptors form a chain (read through :mod:`tiered.archive.chain`): sorted by
start offset, each starts exactly one past the previous end. :func:`commit_descriptor` is the only write the uploader makes to
metadata, and it keeps the chain contiguous and owner-fenced in one transaction:

* contiguity: the new key is absent, and the previous tip descriptor is unchanged
  (``mod_revision``), so two writers can never both extend the same tip — and the new
  start is checked against the tip before the transaction is built;
* fencing: the caller's compares (``value_is(owner_key, held owner record)``) hold.

When the transaction fails, its failure branch reads back every compared key so the
cause is known without a second round trip: fencing → :class:`OwnershipLost`; our own
descriptor already there (a retried commit whose first attempt did land) → success;
anything else → :class:`CommitConflict` and the caller re-reads the chain.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from tiered.archive.chain import ChainTip, DescriptorChain, decode_descriptor
from tiered.metadata.base import Compare, Get, KeyValue, MetadataStore, Put, absent, mod_revision_is
from uploader.errors import CommitConflict, OwnershipLost
from uploader.records import ObjectDescriptor, descriptor_key, encode_descriptor
from wal.topics import TopicName

log = logging.getLogger(__name__)


def read_tip(metadata: MetadataStore, topic: TopicName) -> ChainTip:
    """The chain's tip, every descriptor decoded on the way (one that does not parse stops
    archiving rather than being skipped: skipping would let us commit over a range someone
    else already holds)."""
    return DescriptorChain(metadata, topic).tip()


def commit_descriptor(metadata: MetadataStore, topic: TopicName, descriptor: ObjectDescriptor,
                      tip: ChainTip, fencing: Sequence[Compare]) -> ChainTip:
    """Append ``descriptor`` after ``tip``; returns the new tip.

    Raises OwnershipLost when a fencing compare fails, CommitConflict when the chain
    moved (the caller re-reads it), and storage errors as they come (a timeout leaves
    the outcome unknown: retrying this call is safe and recognises its own success).
    """
    expected_start = 0 if tip.descriptor is None else tip.descriptor.end_offset + 1
    if tip.descriptor is not None and descriptor.start_offset != expected_start:
        raise CommitConflict(
            f"topic {topic}: descriptor starts at {descriptor.start_offset}, chain tip ends at "
            f"{tip.descriptor.end_offset}"
        )
    key = descriptor_key(topic, descriptor.start_offset)
    compares = [absent(key), *fencing]
    watched = [key, *(c.key for c in fencing)]
    if tip.descriptor is not None:
        tip_key = descriptor_key(topic, tip.descriptor.start_offset)
        compares.append(mod_revision_is(tip_key, tip.mod_revision))
        watched.append(tip_key)
    watched = list(dict.fromkeys(watched))
    result = metadata.txn(compares, [Put(key, encode_descriptor(descriptor))], [Get(k) for k in watched])
    if result.succeeded:
        return ChainTip(descriptor, result.revision)
    current = dict(zip(watched, result.responses))
    return _explain_failure(topic, descriptor, key, fencing, current)


def _explain_failure(topic: TopicName, descriptor: ObjectDescriptor, key: str,
                     fencing: Sequence[Compare], current: Mapping[str, object]) -> ChainTip:
    for compare in fencing:
        kv = current.get(compare.key)
        if not compare.holds(kv if isinstance(kv, KeyValue) else None):
            raise OwnershipLost(str(topic), f"descriptor commit (fencing compare on {compare.key} failed)")
    existing = current.get(key)
    if isinstance(existing, KeyValue):
        found = decode_descriptor(key, existing.value)
        if _same_object(found, descriptor):
            log.info("topic %s: descriptor %s was already committed (retried commit)", topic, key)
            return ChainTip(found, existing.mod_revision)
        raise CommitConflict(
            f"topic {topic}: {key} already holds {found.start_offset}-{found.end_offset} "
            f"object {found.object_id!r}"
        )
    raise CommitConflict(f"topic {topic}: the chain tip changed before {key} could be committed")


def _same_object(a: ObjectDescriptor, b: ObjectDescriptor) -> bool:
    return (a.start_offset, a.end_offset, a.object_id) == (b.start_offset, b.end_offset, b.object_id)


def same_content(a: ObjectDescriptor, b: ObjectDescriptor) -> bool:
    """Whether two descriptors name the same object with the same content and writer (all
    but when each was made): how an uploader recognises a commit of its own it sent."""
    def fields(d: ObjectDescriptor) -> tuple[object, ...]:
        return (d.start_offset, d.end_offset, d.object_id, d.size, d.broker_id, d.epoch, d.footer_crc32c,
                d.block_crc32c, d.format, d.compression)
    return fields(a) == fields(b)
