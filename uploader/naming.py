"""Object keys of archived ranges: the range plus the writer's ownership epoch.

Keys are spelled in one place, :func:`tiered.metadata.keys.object_key`
(``<ns>/<topic>/<object_id>.dnb1`` relative to the object store's URL
prefix, built from a validated :class:`TopicName`, so nothing can traverse out). The
uploader's ``object_id`` is ``data-<start>-<end>-e<epoch>``: a pure function of the range
and of the ownership epoch it holds. So

* a retried or restarted upload by the same owner writes the same key,
  ``put(if_absent=True)`` detects it and the existing object is adopted instead of
  leaking an orphan;
* two owners never share a key (epochs are unique per topic), so a fenced owner that
  keeps uploading can never replace an object the new owner committed — even on a server
  that ignores ``If-None-Match``. The conditional put stays as an extra guard.

When our own key already holds *different* frames, the object goes under
``data-<start>-<end>-e<epoch>-<nonce>``, never over the existing one. The descriptor
records whichever id was used. Keys without an epoch (``data-<start>-<end>``) and the
earlier ``<start:020d>-<id>`` layout are still parsed (for GC and verify of old archives)
by the one pattern below.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tiered.metadata import keys
from wal.topics import TopicName

# The one pattern of archive object names: ``data-<start>-<end>[-e<epoch>[-<nonce>]]``, or
# the earlier layout ``<start:020d>-<any id>`` (start offset only).
_KEY_TAIL_RE = re.compile(
    r"(?:(data-(\d{1,20})-(\d{1,20})(?:-e(\d{1,20})(?:-([0-9a-f]{1,16}))?)?)"
    r"|(\d{20})-[A-Za-z0-9_-]{1,100})\.dnb1")


@dataclass(frozen=True, slots=True)
class ObjectName:
    """A parsed archive object key of the uploader's naming scheme."""

    key: str
    object_id: str
    start_offset: int
    end_offset: int
    epoch: int | None


def object_id_for(start_offset: int, end_offset: int, epoch: int,
                  nonce: str | None = None) -> str:
    """``data-<start>-<end>-e<epoch>`` (``-<nonce>`` appended for the fallback id)."""
    if start_offset < 0 or end_offset < start_offset:
        raise ValueError(f"bad offset range {start_offset}-{end_offset}")
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"bad epoch {epoch!r}")
    return f"data-{start_offset}-{end_offset}-e{epoch}" + (f"-{nonce}" if nonce else "")


def object_key(topic: TopicName, start_offset: int, object_id: str) -> str:
    return keys.object_key(topic, start_offset, object_id)


def topic_objects_prefix(topic: TopicName) -> str:
    """Object-store prefix holding every object of the topic."""
    return keys.objects_key_prefix(topic)


def range_key_prefix(topic: TopicName, start_offset: int) -> str:
    """Prefix of every object of ours that starts at ``start_offset``."""
    sample_id = object_id_for(start_offset, start_offset, 0)
    sample = object_key(topic, start_offset, sample_id)
    return sample[: sample.rindex(sample_id)] + f"data-{start_offset}-"


def parse_object_key(topic: TopicName, key: str) -> ObjectName | None:
    """The range a key of this topic names, or None for keys this scheme did not write."""
    prefix = topic_objects_prefix(topic)
    if not key.startswith(prefix):
        return None
    match = _KEY_TAIL_RE.fullmatch(key[len(prefix):])
    if match is None or match.group(1) is None:
        return None
    start, end = int(match.group(2)), int(match.group(3))
    if end < start:
        return None
    epoch = int(match.group(4)) if match.group(4) is not None else None
    return ObjectName(key, match.group(1), start, end, epoch)


def key_start_offset(topic: TopicName, key: str) -> int | None:
    """The start offset any archive object name of this topic carries (every layout ever
    written), or None for a key that follows none."""
    prefix = topic_objects_prefix(topic)
    if not key.startswith(prefix):
        return None
    match = _KEY_TAIL_RE.fullmatch(key[len(prefix):])
    if match is None:
        return None
    return int(match.group(2) if match.group(1) is not None else match.group(6))
