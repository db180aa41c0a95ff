"""Orphaned objects: delete them once they can never be adopted.

An orphan (found by :func:`tiered.archive.orphans.find_orphans`) is an object under the
topic's prefix that no descriptor references: a crash between PUT and commit, a lost
commit race, a dead previous owner's upload of offsets that were later reassigned, or an
archive retention cut (``uploader/archive_retention.py``) interrupted after deleting its
descriptors and before deleting their objects.

:func:`collect_garbage` deletes an orphan only when all of these hold:

* it is older than the grace period (an upload in flight has not committed yet);
* its start offset is at or below the committed chain end, or below the archive start,
  so no uploader can ever adopt it (uploads only start past the chain end, and retention
  never leaves the start past the chain's last descriptor) — orphans beyond the tip are
  reported but kept, because the next pass may adopt them;
* a fresh re-read of the descriptors, right before deleting, still does not reference it
  (a referenced object is never deleted here, above or below the archive start: the
  descriptors of an interrupted cut are deleted first, by the owner's next retention run).
"""
from __future__ import annotations

import logging

from tiered.archive.chain import list_descriptors
from tiered.archive.naming import descriptor_object_key
from tiered.archive.orphans import find_orphans
from tiered.metadata.base import MetadataStore
from tiered.objects.base import ObjectStore
from wal.topics import TopicName

log = logging.getLogger(__name__)


def collect_garbage(metadata: MetadataStore, objects: ObjectStore, topic: TopicName | str,
                    grace_s: float) -> list[str]:
    """Delete collectable orphans older than ``grace_s``; returns the deleted keys."""
    if grace_s < 0:
        raise ValueError("grace_s must be >= 0")
    topic = TopicName.parse(topic)
    # In offset order: a run cut short (a crash, a store error) leaves the rest of
    # retention's leftovers as one contiguous run, not holes that a read by location would
    # skip (atk60 f02). Collectable orphans always have a start offset.
    due = sorted((o for o in find_orphans(metadata, objects, topic) if o.collectable and o.age_s >= grace_s),
                 key=lambda o: o.start_offset if o.start_offset is not None else -1)
    if not due:
        return []
    # Re-read right before deleting: never delete an object a descriptor references.
    referenced = {descriptor_object_key(topic, d) for d in list_descriptors(metadata, topic)}
    deleted = []
    for orphan in due:
        if orphan.key in referenced:
            continue
        objects.delete(orphan.key)
        log.info("topic %s: deleted orphan %s (%d bytes, %.0f s old)", topic, orphan.key, orphan.size, orphan.age_s)
        deleted.append(orphan.key)
    return deleted

