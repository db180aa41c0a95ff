"""Orphaned objects: find them, and delete them once they can never be adopted.

An orphan is an object under the topic's prefix that no descriptor references: a crash
between PUT and commit, a lost commit race, or a dead previous owner's upload of offsets
that were later reassigned.

:func:`collect_garbage` deletes an orphan only when all of these hold:

* it is older than the grace period (an upload in flight has not committed yet);
* its start offset is at or below the committed chain end, so no uploader can ever
  adopt it (uploads only start past the chain end) — orphans beyond the tip are reported
  but kept, because the next pass may adopt them;
* a fresh re-read of the descriptors, right before deleting, still does not reference it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tiered.metadata.base import MetadataStore
from tiered.objects.base import ObjectStore
from uploader.commit import list_descriptors
from uploader.naming import key_start_offset, object_key, topic_objects_prefix
from wal.topics import TopicName

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Orphan:
    """An object no descriptor references."""

    key: str
    start_offset: int | None  # None when the key does not follow the layout at all
    size: int
    age_s: float
    collectable: bool  # at or below the chain end: it can never be adopted


def find_orphans(metadata: MetadataStore, objects: ObjectStore, topic: TopicName | str,
                 now_s: float | None = None) -> list[Orphan]:
    """Objects of ``topic`` that no committed descriptor references."""
    topic = TopicName.parse(topic)
    now_s = time.time() if now_s is None else now_s
    # Descriptors first: an object committed after this read shows up as an orphan (young,
    # so protected by the grace period); never the other way round.
    descriptors = list_descriptors(metadata, topic)
    referenced = {object_key(topic, d.start_offset, d.object_id) for d in descriptors}
    chain_end = descriptors[-1].end_offset if descriptors else -1
    prefix = topic_objects_prefix(topic)
    orphans = []
    for info in objects.list(prefix):
        if info.key in referenced:
            continue
        start = key_start_offset(topic, info.key)
        orphans.append(Orphan(
            key=info.key, start_offset=start, size=info.size,
            age_s=max(0.0, now_s - info.last_modified),
            collectable=start is not None and start <= chain_end,
        ))  # fmt: skip
    return orphans


def collect_garbage(metadata: MetadataStore, objects: ObjectStore, topic: TopicName | str,
                    grace_s: float) -> list[str]:
    """Delete collectable orphans older than ``grace_s``; returns the deleted keys."""
    if grace_s < 0:
        raise ValueError("grace_s must be >= 0")
    topic = TopicName.parse(topic)
    due = [o for o in find_orphans(metadata, objects, topic) if o.collectable and o.age_s >= grace_s]
    if not due:
        return []
    # Re-read right before deleting: never delete an object a descriptor references.
    referenced = {object_key(topic, d.start_offset, d.object_id) for d in list_descriptors(metadata, topic)}
    deleted = []
    for orphan in due:
        if orphan.key in referenced:
            continue
        objects.delete(orphan.key)
        log.info("topic %s: deleted orphan %s (%d bytes, %.0f s old)", topic, orphan.key, orphan.size, orphan.age_s)
        deleted.append(orphan.key)
    return deleted

