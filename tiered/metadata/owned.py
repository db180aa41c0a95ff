"""A record that one owner rewrites again and again: a subscription cursor, the
published durable tip.

Fencing alone is not enough for such a record. With a three-member etcd cluster a
write sent through a member that then pauses can time out on the client and still be
applied later, after a newer write that went through another member; the fencing
compare still holds (the same broker owns the topic), so the old value lands last and
the record moves backward (a cursor regressing re-delivers acknowledged messages).

So every write also compares the key's ``mod_revision`` with the revision this writer
last saw: a delayed write can only land if nothing was written after the state it was
based on. A write whose outcome is unknown (timeout, connection lost) forgets the
revision, and the next write re-reads the key before it writes: what landed is
re-driven, never assumed.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from types import EllipsisType

from tiered.errors import StorageError
from tiered.metadata.base import Compare, KeyValue, MetadataStore, Put, mod_revision_is

#: Attempts when the key changed under us (someone else's write, or our own delayed one).
_CONFLICT_ATTEMPTS = 5


class RecordFenced(StorageError):
    """The fencing compares failed: the writer no longer owns what the record is about."""

    def __init__(self, key: str) -> None:
        super().__init__(f"{key}: write refused by fencing (ownership moved on)")
        self.key = key


class OwnedRecord:
    """The writer's side of one such key. Not thread-safe: one writer at a time (callers
    hold their own lock around ``write``)."""

    def __init__(self, metadata: MetadataStore, key: str, seen: KeyValue | None | EllipsisType = ...) -> None:
        """``seen``: the key as the caller last read it (None: absent); omitted when
        unknown, and then the first write reads it."""
        self.metadata = metadata
        self.key = key
        self._revision: int | None = None
        if seen is not ...:
            self._revision = 0 if seen is None else seen.mod_revision

    def write(self, value: bytes, fencing: Sequence[Compare],
              covers: Callable[[bytes], bool] = lambda stored: False) -> None:
        """Write ``value`` if the key did not change since this writer last saw it.

        ``covers(stored)``: True when a value found in the store already says at least
        what ``value`` says (for a cursor: stored >= ours); then nothing is written.
        Raises :class:`RecordFenced` when the fencing fails, ``StorageError`` when the
        outcome is unknown (the next write re-reads first)."""
        for _ in range(_CONFLICT_ATTEMPTS):
            if self._revision is None:
                kv = self._read()
                if kv is not None and covers(kv.value):
                    return
            revision = self._revision
            assert revision is not None
            try:
                result = self.metadata.txn([*fencing, mod_revision_is(self.key, revision)], [Put(self.key, value)])
            except StorageError:
                self._revision = None  # it may have landed: re-read before the next write
                raise
            if result.succeeded:
                self._revision = result.revision
                return
            if not self.metadata.txn(list(fencing), []).succeeded:
                raise RecordFenced(self.key)
            self._revision = None  # the key changed: look at what is there now
        raise StorageError(f"{self.key}: kept changing under {_CONFLICT_ATTEMPTS} writes in a row")

    def _read(self) -> KeyValue | None:
        kv = self.metadata.get(self.key)
        self._revision = 0 if kv is None else kv.mod_revision
        return kv
