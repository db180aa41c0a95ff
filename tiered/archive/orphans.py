"""Orphaned objects: objects under a topic's prefix that no descriptor references.

A crash between PUT and commit, a lost commit race, a dead previous owner's upload of
offsets that were later reassigned, or an archive retention cut interrupted after its
descriptors were deleted leaves one. Finding them only reads (``dnb verify``
lists them); deleting them is the uploader's (``uploader/gc.py``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from tiered.archive.chain import list_descriptors
from tiered.archive.naming import descriptor_object_key, key_start_offset, topic_objects_prefix
from tiered.archive.start import archive_start
from tiered.metadata.base import MetadataStore
from tiered.objects.base import ObjectStore
from wal.topics import TopicName


@dataclass(frozen=True, slots=True)
class Orphan:
    """An object no descriptor references."""

    key: str
    start_offset: int | None  # None when the key does not follow the layout at all
    size: int
    age_s: float
    collectable: bool  # at or below the chain end, or below the archive start: never adopted
    below_start: bool = False  # its range starts below the archive start (retention's leftover)


def find_orphans(metadata: MetadataStore, objects: ObjectStore, topic: TopicName | str,
                 now_s: float | None = None) -> list[Orphan]:
    """Objects of ``topic`` that no committed descriptor references."""
    topic = TopicName.parse(topic)
    now_s = time.time() if now_s is None else now_s
    # Descriptors first: an object committed after this read shows up as an orphan (young,
    # so protected by the grace period); never the other way round.
    first_retained = archive_start(metadata, topic)
    descriptors = list_descriptors(metadata, topic)
    referenced = {descriptor_object_key(topic, d) for d in descriptors}
    chain_end = descriptors[-1].end_offset if descriptors else -1
    orphans = []
    for info in objects.list(topic_objects_prefix(topic)):
        if info.key in referenced:
            continue
        start = key_start_offset(topic, info.key)
        orphans.append(Orphan(
            key=info.key, start_offset=start, size=info.size,
            age_s=max(0.0, now_s - info.last_modified),
            # Below the archive start nothing is ever uploaded again; at or below the chain
            # end no upload can adopt it (uploads start past the end).
            collectable=start is not None and (start <= chain_end or start < first_retained),
            below_start=start is not None and start < first_retained,
        ))  # fmt: skip
    return orphans


__all__ = ["Orphan", "find_orphans"]
