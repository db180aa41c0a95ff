"""A topic's descriptor chain in metadata: the one way to read it.

A topic's committed descriptors live under ``/storage/topics/<ns>/<topic>/objects/``, one
key per object, keyed by its 20-digit start offset, so key order is offset order. The
uploader keeps them a chain (each starts one past the previous end; see
``uploader/commit.py`` for the fenced write); retention may remove a prefix of it.

:class:`DescriptorChain` pages over them with ``range(prefix, limit, start_after)``, so a
long chain never sits in memory at once, and decodes every record with
:func:`decode_descriptor`: a record that does not parse, or sits under a key its start
offset does not name, raises :class:`~tiered.errors.MalformedRecord` naming the key. A
descriptor that cannot be read is never skipped: skipping one would let a reader serve a
gap as if it were the end, and a writer commit over a range someone else already holds.

The chain does not itself check contiguity: restore (``BrokenChain``), Spark
(``ArchiveInconsistent``), the cloud reader (``DataGap``) and verify (a report) each
say what a hole means to them.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from tiered.metadata import keys
from tiered.metadata.base import KeyValue, MetadataStore
from tiered.metadata.keys import ObjectDescriptor
from wal.topics import TopicName

#: Descriptors read per metadata request.
PAGE_KEYS = 1000


def decode_descriptor(key: str, value: bytes) -> ObjectDescriptor:
    """The descriptor stored under ``key``; MalformedRecord when it does not parse or sits
    under another start offset's key."""
    return ObjectDescriptor.from_json(key, value).check_key(key)


@dataclass(frozen=True, slots=True)
class ChainTip:
    """The last committed descriptor (None when the topic has none) and its revision."""

    descriptor: ObjectDescriptor | None
    mod_revision: int = 0

    @property
    def end_offset(self) -> int | None:
        return None if self.descriptor is None else self.descriptor.end_offset


class DescriptorChain:
    """The committed descriptors of one topic, read lazily in offset order."""

    def __init__(self, metadata: MetadataStore, topic: TopicName | str, *, page_keys: int = PAGE_KEYS) -> None:
        if page_keys <= 0:
            raise ValueError("page_keys must be > 0")
        self.metadata = metadata
        self.topic = TopicName.parse(topic)
        self.prefix = keys.objects_prefix(self.topic)
        self.page_keys = page_keys

    def entries(self, start_after: str | None = None) -> Iterator[tuple[ObjectDescriptor, KeyValue]]:
        """Every descriptor after the key ``start_after`` (all when None), with its raw
        entry (its ``mod_revision`` fences a commit after it)."""
        for page in self._pages(start_after):
            for kv in page:
                yield decode_descriptor(kv.key, kv.value), kv

    def __iter__(self) -> Iterator[ObjectDescriptor]:
        """Every descriptor, in offset order."""
        return (descriptor for descriptor, _ in self.entries())

    def all(self) -> list[ObjectDescriptor]:
        """Every descriptor, in offset order, as a list."""
        return list(self)

    def first(self) -> ObjectDescriptor | None:
        """The descriptor with the lowest start offset (None: nothing archived)."""
        page = self.metadata.range(self.prefix, limit=1)
        return decode_descriptor(page[0].key, page[0].value) if page else None

    def last(self) -> ObjectDescriptor | None:
        """The descriptor with the highest start offset (None: nothing archived). The store
        has no reverse range, so this pages forward over the keys, decoding only the last."""
        last: KeyValue | None = None
        for page in self._pages(None):
            last = page[-1]
        return None if last is None else decode_descriptor(last.key, last.value)

    def tip(self) -> ChainTip:
        """The last descriptor and its ``mod_revision``, with EVERY descriptor decoded on the
        way: a descriptor we cannot parse must stop archiving rather than be skipped."""
        tip = ChainTip(None, 0)
        for descriptor, kv in self.entries():
            tip = ChainTip(descriptor, kv.mod_revision)
        return tip

    def next_offset(self) -> int:
        """One past the last descriptor's end (0 when nothing is archived)."""
        last = self.last()
        return 0 if last is None else last.end_offset + 1

    def covering(self, start: int, end_inclusive: int | None = None) -> Iterator[ObjectDescriptor]:
        """Descriptors overlapping ``[start, end_inclusive]`` (to the chain's end when None),
        in offset order; reading stops at the first one past the range."""
        for descriptor in self:
            if end_inclusive is not None and descriptor.start_offset > end_inclusive:
                return
            if descriptor.end_offset >= start:
                yield descriptor

    def _pages(self, start_after: str | None) -> Iterator[list[KeyValue]]:
        after = start_after
        while True:
            page = self.metadata.range(self.prefix, limit=self.page_keys, start_after=after)
            if page:
                yield page
            if len(page) < self.page_keys:
                return
            after = page[-1].key


def list_descriptors(metadata: MetadataStore, topic: TopicName | str) -> list[ObjectDescriptor]:
    """Every committed descriptor of ``topic`` in offset order."""
    return DescriptorChain(metadata, topic).all()


def last_committed_offset(metadata: MetadataStore, topic: TopicName | str) -> int | None:
    """End offset of the last committed descriptor; None when nothing is archived."""
    return DescriptorChain(metadata, topic).tip().end_offset


__all__ = [
    "ChainTip", "DescriptorChain", "PAGE_KEYS", "decode_descriptor", "last_committed_offset", "list_descriptors",
]  # fmt: skip
