"""Object keys of archived ranges, deterministic from the range.

Keys are spelled in one place, :func:`tiered.metadata.keys.object_key`
(``<ns>/<topic>/<object_id>.dnb1`` relative to the object store's URL
prefix, built from a validated :class:`TopicName`, so nothing can traverse out). The
uploader picks an ``object_id`` that is a pure function of the range,
``data-<start>-<end>``, so a retried or restarted upload of the same range writes the same
key, ``put(if_absent=True)`` detects it and the existing object is adopted instead of
leaking an orphan.

When that key already holds *different* frames (a dead previous owner archived offsets
that were later reassigned), the object goes under the epoch-qualified id
``data-<start>-<end>-e<epoch>`` — never over the existing object, which a stale owner
could still be racing for. The descriptor records whichever id was used.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from tiered.metadata import keys
from wal.topics import TopicName

_KEY_TAIL_RE = re.compile(r"(data-(\d{1,20})-(\d{1,20})(?:-e(\d{1,20})(?:-([0-9a-f]{1,16}))?)?)\.dnb1")


@dataclass(frozen=True, slots=True)
class ObjectName:
    """A parsed archive object key of the uploader's naming scheme."""

    key: str
    object_id: str
    start_offset: int
    end_offset: int
    epoch: int | None


def object_id_for(start_offset: int, end_offset: int, epoch: int | None = None,
                  nonce: str | None = None) -> str:
    """``data-<start>-<end>`` (or the epoch-qualified fallback id)."""
    if start_offset < 0 or end_offset < start_offset:
        raise ValueError(f"bad offset range {start_offset}-{end_offset}")
    object_id = f"data-{start_offset}-{end_offset}"
    if epoch is not None:
        object_id += f"-e{epoch}" + (f"-{nonce}" if nonce else "")
    return object_id


def object_key(topic: TopicName, start_offset: int, object_id: str) -> str:
    return keys.object_key(topic, start_offset, object_id)


def topic_objects_prefix(topic: TopicName) -> str:
    """Object-store prefix holding every object of the topic."""
    return keys.objects_key_prefix(topic)


def range_key_prefix(topic: TopicName, start_offset: int) -> str:
    """Prefix of every object of ours that starts at ``start_offset``."""
    sample_id = object_id_for(start_offset, start_offset)
    sample = object_key(topic, start_offset, sample_id)
    return sample[: sample.rindex(sample_id)] + f"data-{start_offset}-"


def parse_object_key(topic: TopicName, key: str) -> ObjectName | None:
    """The range a key of this topic names, or None for keys this scheme did not write."""
    prefix = topic_objects_prefix(topic)
    if not key.startswith(prefix):
        return None
    match = _KEY_TAIL_RE.fullmatch(key[len(prefix):])
    if match is None:
        return None
    start, end = int(match.group(2)), int(match.group(3))
    if end < start:
        return None
    epoch = int(match.group(4)) if match.group(4) is not None else None
    return ObjectName(key, match.group(1), start, end, epoch)
