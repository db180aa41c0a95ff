"""Object keys of archived ranges: built and parsed here, and nowhere else.

An archived object's key, relative to the object store's URL prefix, is
``<ns>/<topic>/<object_id>.dnb1``, built from a validated :class:`TopicName` (so nothing
can traverse out of the topic's prefix). The uploader's ``object_id`` is
``data-<start>-<end>-e<epoch>``: a pure function of the range and of the ownership epoch
it holds. So

* a retried or restarted upload by the same owner writes the same key,
  ``put(if_absent=True)`` detects it and the existing object is adopted instead of
  leaking an orphan;
* two owners never share a key (epochs are unique per topic), so a fenced owner that
  keeps uploading can never replace an object the new owner committed — even on a server
  that ignores ``If-None-Match``. The conditional put stays as an extra guard.

When our own key already holds *different* frames, the object goes under
``data-<start>-<end>-e<epoch>-<nonce>``, never over the existing one. The descriptor
records whichever id was used, so readers always build the key from the descriptor
(:func:`descriptor_object_key`). Keys without an epoch (``data-<start>-<end>``) and the
earlier ``<start:020d>-<id>`` layout are still parsed (for GC and verify of old archives)
by the one pattern below.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tiered.metadata.keys import OBJECT_ID_RE, ObjectDescriptor
from wal.topics import TopicName

OBJECT_SUFFIX = ".dnb1"

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


def object_key(topic: TopicName | str, start_offset: int, object_id: str) -> str:
    """Object-store key of one archived dnb1 object: ``<ns>/<topic>/<object_id>.dnb1``.

    ``start_offset`` is checked against a ``data-<start>-…`` id so a descriptor can never
    point at another range's object.
    """
    t = TopicName.parse(topic)
    if not isinstance(object_id, str) or not OBJECT_ID_RE.fullmatch(object_id):
        raise ValueError(f"object id {object_id!r} must be 1-100 characters of [A-Za-z0-9_-]")
    if object_id.startswith("data-") and not object_id.startswith(f"data-{_offset(start_offset)}-"):
        raise ValueError(f"object id {object_id!r} does not start at offset {start_offset}")
    return f"{t.namespace}/{t.name}/{object_id}{OBJECT_SUFFIX}"


def descriptor_object_key(topic: TopicName | str, descriptor: ObjectDescriptor) -> str:
    """The key of the object a committed descriptor points at."""
    return object_key(topic, descriptor.start_offset, descriptor.object_id)


def _offset(offset: int) -> int:
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, got {offset!r}")
    return offset


def topic_objects_prefix(topic: TopicName | str) -> str:
    """Object-store prefix holding every object of the topic."""
    t = TopicName.parse(topic)
    return f"{t.namespace}/{t.name}/"


def range_key_prefix(topic: TopicName, start_offset: int) -> str:
    """Prefix of every object of ours that starts at ``start_offset``."""
    return topic_objects_prefix(topic) + f"data-{_offset(start_offset)}-"


def parse_object_key(topic: TopicName, key: str) -> ObjectName | None:
    """The range a key of this topic names, or None for keys this scheme did not write."""
    match = _match(topic, key)
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
    match = _match(topic, key)
    if match is None:
        return None
    return int(match.group(2) if match.group(1) is not None else match.group(6))


def _match(topic: TopicName, key: str) -> re.Match[str] | None:
    prefix = topic_objects_prefix(topic)
    if not key.startswith(prefix):
        return None
    return _KEY_TAIL_RE.fullmatch(key[len(prefix):])


__all__ = [
    "OBJECT_SUFFIX", "ObjectName", "descriptor_object_key", "key_start_offset", "object_id_for", "object_key",
    "parse_object_key", "range_key_prefix", "topic_objects_prefix",
]  # fmt: skip
