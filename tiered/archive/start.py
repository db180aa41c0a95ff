"""A topic's archive start: the first offset its archive retains.

Archive retention (``uploader/archive_retention.py``, run by the topic's owner) removes a
prefix of the descriptor chain. Before it removes anything it raises the persisted start
(``keys.archive_start_key``, an :class:`~tiered.metadata.keys.ArchiveStart`) in a
transaction fenced by the owner record, so every offset below the start is gone *by
decision*, and a reader can tell that apart from a hole:

* an offset ``< start`` is :class:`OffsetBelowArchiveStart` (a
  :class:`wal.errors.OffsetBelowRetention`) naming the first retained offset;
* a missing offset ``>= start`` stays a data error (``DataGap``, ``BrokenChain``, a
  verify ``gap``).

Descriptors wholly below the start may still exist for a while (a cut is start first,
then descriptors, then objects; a crash in between leaves them): every reader ignores
them, the next retention run of an owner deletes them, and orphan GC deletes objects whose
descriptors are gone.

No record means the archive starts at 0 (nothing was ever cut).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from tiered.metadata import keys
from tiered.metadata.base import KeyValue, MetadataStore
from tiered.metadata.keys import ArchiveStart, ObjectDescriptor, TopicTombstone
from wal.errors import OffsetBelowRetention, WalError
from wal.topics import TopicName


class OffsetBelowArchiveStart(OffsetBelowRetention):
    """A read asked for an offset that archive retention removed.

    ``offset`` is the offset asked for, ``first_offset`` the first one the topic still
    holds (start reading there, or at ``"earliest"``)."""

    def __init__(self, topic: TopicName | str, offset: int, first_offset: int) -> None:
        WalError.__init__(self, f"topic {topic}: offset {offset} is below the archive's retention; "
                                f"the first retained offset is {first_offset}")
        self.topic = str(topic)
        self.offset = offset
        self.first_offset = first_offset


def read_archive_start(metadata: MetadataStore, topic: TopicName | str) -> tuple[ArchiveStart | None, KeyValue | None]:
    """The start record and its raw entry (both None: nothing was ever cut).
    A record that does not parse is :class:`~tiered.errors.MalformedRecord`: a reader
    must not guess where the topic starts."""
    kv = metadata.get(keys.archive_start_key(topic))
    if kv is None:
        return None, None
    return ArchiveStart.from_json(kv.key, kv.value), kv


def incarnation_first_offset(metadata: MetadataStore, topic: TopicName | str) -> int:
    """Where the topic's current incarnation starts: 0, or, for a name that was deleted and
    created again, the tombstone's ``next_offset`` (numbering continues past the deleted
    incarnation, so no offset is ever given to two messages under one name)."""
    tomb, _raw = keys.read_tombstone(metadata, topic)
    return incarnation_start(tomb)


def incarnation_start(tomb: TopicTombstone | None) -> int:
    """:func:`incarnation_first_offset` from a tombstone already read (None: none)."""
    return tomb.next_offset if tomb is not None and tomb.phase == "recreated" else 0


def archive_cut(metadata: MetadataStore, topic: TopicName | str) -> int:
    """Where archive retention's last cut left the start (0: nothing was ever cut)."""
    record, _ = read_archive_start(metadata, topic)
    return 0 if record is None else record.first_offset


def archive_start(metadata: MetadataStore, topic: TopicName | str) -> int:
    """The first offset the topic still holds: past archive retention's cut and, for a
    re-created topic, at or past its incarnation's first offset (0 when neither applies).
    Everything below it is gone by decision (:class:`OffsetBelowArchiveStart`)."""
    return max(archive_cut(metadata, topic), incarnation_first_offset(metadata, topic))


def check_retained(metadata: MetadataStore, topic: TopicName | str, offset: int) -> None:
    """Raise :class:`OffsetBelowArchiveStart` when ``offset`` is below the archive start."""
    first = archive_start(metadata, topic)
    if offset < first:
        raise OffsetBelowArchiveStart(topic, offset, first)


def retained(descriptors: Iterable[ObjectDescriptor], start: int) -> Iterator[ObjectDescriptor]:
    """The descriptors a reader may use: those not wholly below ``start`` (the ones below
    are a cut's leftovers, pending deletion)."""
    return (d for d in descriptors if d.end_offset >= start)


__all__ = ["OffsetBelowArchiveStart", "archive_cut", "archive_start", "check_retained", "incarnation_first_offset",
           "incarnation_start", "read_archive_start", "retained"]
