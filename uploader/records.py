"""Descriptor records and metadata keys, as the uploader uses them.

The key layout and record encoding are owned by ``tiered.metadata.keys`` (see
docs/ARCHITECTURE.md); this module is the uploader's only door to them.
"""
from __future__ import annotations

from collections.abc import Sequence

from tiered.errors import MalformedRecord
from tiered.metadata import keys
from tiered.metadata.base import Compare
from tiered.metadata.keys import ObjectDescriptor, Ownership
from wal.topics import TopicName


def descriptor_key(topic: TopicName, start_offset: int) -> str:
    """``/storage/topics/<ns>/<topic>/objects/<start, 20 digits>``."""
    return keys.descriptor_key(topic, start_offset)


def encode_descriptor(descriptor: ObjectDescriptor) -> bytes:
    return descriptor.to_json()


def epoch_from_fencing(topic: TopicName, fencing: Sequence[Compare]) -> int | None:
    """The ownership epoch held, read from the ``value_is(owner_key, record)`` compare."""
    owner = keys.owner_key(topic)
    for compare in fencing:
        if compare.key == owner and compare.target == "value" and compare.op == "==":
            try:
                return Ownership.from_json(owner, bytes(compare.operand)).epoch
            except MalformedRecord:
                return None
    return None


__all__ = [
    "ObjectDescriptor", "descriptor_key", "encode_descriptor",
    "epoch_from_fencing",
]  # fmt: skip
