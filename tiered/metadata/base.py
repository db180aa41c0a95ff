"""The metadata store interface: an etcd-shaped key/value store.

Semantics every backend follows (the contract suite in ``tests/stores`` checks them):

* Keys are ``str`` (UTF-8 on the wire), values ``bytes``.
* Every write transaction bumps one global revision. A key records the revision that
  created it (``create_revision``), last changed it (``mod_revision``) and how many
  times it was written since creation (``version``; 0 means absent).
* ``txn`` evaluates all compares atomically; if all hold it runs ``success`` else
  ``failure``. A ``value`` compare on an absent key is false; ``version``,
  ``create_revision`` and ``mod_revision`` of an absent key are 0, so
  ``version_is(k, 0)`` is create-if-absent. A key may be written at most once per
  op list.
* ``range`` returns keys under a prefix in ascending key order.
* ``snapshot()`` gives a view whose reads all see the store as of one revision, for a
  reader that must not act on a mix of two moments (each plain read sees the latest).
* ``watch`` yields events with ``revision >= start_revision`` in revision order;
  asking for a compacted revision raises :class:`CompactedRevision`. A watch never
  drops events: a consumer that lags too far gets :class:`WatchOverflow`.
* Keys attached to a lease are deleted (with delete events) when it expires.
"""
from __future__ import annotations

import time

import abc
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal

from tiered.errors import StorageError

CompareTarget = Literal["value", "version", "create_revision", "mod_revision"]
CompareOp = Literal["==", "!=", "<", ">"]

#: Upper bound on events buffered per watch before it fails with WatchOverflow.
WATCH_QUEUE_EVENTS_MAX = 10_000



def lease_clock() -> float:
    """The clock leases are measured on: seconds since boot INCLUDING suspend
    (``CLOCK_BOOTTIME``; the monotonic clock where it does not exist). One clock for every
    process of a machine, which a wall-clock step cannot move; and unlike the monotonic
    clock it runs on while the machine is suspended, as a store's lease countdown does: a
    broker resumed after a suspend sees that its lease may have expired meanwhile."""
    return time.clock_gettime(_LEASE_CLOCK)


_LEASE_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)

@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease_id: int = 0


@dataclass(frozen=True, slots=True)
class PutEvent:
    kv: KeyValue

    @property
    def key(self) -> str:
        return self.kv.key

    @property
    def value(self) -> bytes:
        return self.kv.value

    @property
    def revision(self) -> int:
        return self.kv.mod_revision


@dataclass(frozen=True, slots=True)
class DeleteEvent:
    key: str
    revision: int


Event = PutEvent | DeleteEvent


@dataclass(frozen=True, slots=True)
class Compare:
    """One compare of a transaction: ``<target>(key) <op> operand``."""

    key: str
    target: CompareTarget
    op: CompareOp
    operand: bytes | int

    def holds(self, kv: KeyValue | None) -> bool:
        """Evaluate against the current ``kv`` (None = absent), etcd's rules."""
        if self.target == "value":
            if kv is None:
                return False
            return _apply(self.op, kv.value, self.operand)
        actual = 0 if kv is None else getattr(kv, self.target)
        return _apply(self.op, actual, self.operand)


def _apply(op: CompareOp, left: bytes | int, right: bytes | int) -> bool:
    if op == "==":
        return left == right
    if op == "!=":
        return left != right
    if op == "<":
        return left < right  # type: ignore[operator]
    return left > right  # type: ignore[operator]


def value_is(key: str, value: bytes) -> Compare:
    return Compare(key, "value", "==", value)


def version_is(key: str, version: int) -> Compare:
    return Compare(key, "version", "==", version)


def absent(key: str) -> Compare:
    """Create-if-absent guard: the key has never been written since its last delete."""
    return Compare(key, "version", "==", 0)


def mod_revision_is(key: str, revision: int) -> Compare:
    return Compare(key, "mod_revision", "==", revision)


def create_revision_is(key: str, revision: int) -> Compare:
    return Compare(key, "create_revision", "==", revision)


def failed_compare(metadata: "MetadataStore", compares: Sequence[Compare]) -> Compare | None:
    """The first of ``compares`` that does not hold now (None: all hold), read key by key:
    e.g. whether a fencing compare is why a transaction failed."""
    for compare in compares:
        if not compare.holds(metadata.get(compare.key)):
            return compare
    return None


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease_id: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class Get:
    key: str


Op = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of ``txn``. ``responses`` align with the ops that ran:
    Get → KeyValue | None, Put → None, Delete → bool (whether a key was deleted)."""

    succeeded: bool
    responses: list[KeyValue | None | bool] = field(default_factory=list)
    revision: int = 0


def check_ops(ops: Sequence[Op]) -> None:
    """Reject op lists that etcd rejects, so both backends behave the same."""
    written: set[str] = set()
    for op in ops:
        if not isinstance(op, (Put, Delete, Get)):
            raise TypeError(f"not a txn op: {op!r}")
        check_key(op.key)
        if isinstance(op, Put) and not isinstance(op.value, bytes):
            raise TypeError(f"value for {op.key!r} must be bytes")
        if isinstance(op, (Put, Delete)):
            if op.key in written:
                raise ValueError(f"key {op.key!r} written twice in one transaction")
            written.add(op.key)


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key or "\x00" in key:
        raise ValueError(f"metadata key must be a non-empty str without NUL, got {key!r}")


def prefix_end(prefix: bytes) -> bytes | None:
    """Smallest byte string greater than every key starting with ``prefix``
    (etcd's rule); None when the prefix is empty or all 0xff (no upper bound)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


@dataclass(frozen=True, slots=True)
class Lease:
    id: int
    ttl_s: float


class Watch:
    """A running watch: iterate events, or poll with a bound; cancel from any thread.

    Backends feed it with ``_deliver`` / ``_fail``. The queue is bounded: when a
    consumer lags by ``WATCH_QUEUE_EVENTS_MAX`` events the watch ends with
    :class:`WatchOverflow` rather than silently dropping events.
    """

    def __init__(self, start_revision: int, cancel_hook: Callable[[], object] | None = None) -> None:
        self._queue: queue.Queue[Event | BaseException | None] = queue.Queue(
            WATCH_QUEUE_EVENTS_MAX + 2
        )
        self._cancelled = threading.Event()
        self._cancel_hook = cancel_hook
        self._failed = False
        self.next_revision = start_revision

    # -- consumer side -----------------------------------------------------
    def get(self, timeout_s: float) -> Event | None:
        """Next event, or None after ``timeout_s`` or once cancelled."""
        if self._cancelled.is_set() and self._queue.empty():
            return None
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return None
        if item is None:
            return None
        if isinstance(item, BaseException):
            self._cancelled.set()
            raise item
        self.next_revision = item.revision + 1
        return item

    def __iter__(self) -> Iterator[Event]:
        """Iterate until cancelled (checks for cancel at least every 0.1 s)."""
        while not (self._cancelled.is_set() and self._queue.empty()):
            event = self.get(timeout_s=0.1)
            if event is not None:
                yield event

    def cancel(self) -> None:
        if self._cancelled.is_set():
            return
        self._cancelled.set()
        if self._cancel_hook is not None:
            self._cancel_hook()
        self._offer(None)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    # -- producer side -----------------------------------------------------
    def _deliver(self, event: Event) -> bool:
        """Queue one event; False once the watch is over (cancelled or overflowed)."""
        if self._cancelled.is_set() or self._failed:
            return False
        if self._queue.qsize() >= WATCH_QUEUE_EVENTS_MAX:
            from tiered.errors import WatchOverflow

            self._fail(WatchOverflow(event.revision))
            return False
        self._queue.put_nowait(event)
        return True

    def _fail(self, error: BaseException) -> None:
        if self._failed or self._cancelled.is_set():
            return
        self._failed = True
        self._offer(error)
        if self._cancel_hook is not None:
            self._cancel_hook()

    def _offer(self, item: BaseException | None) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            pass  # The consumer will see the overflow error or the cancel flag.


class ReadView(abc.ABC):
    """Reads that all see the store as of :attr:`revision`
    (:meth:`MetadataStore.snapshot`)."""

    revision: int

    @abc.abstractmethod
    def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    def range(self, prefix: str, limit: int = 0, start_after: str | None = None) -> list[KeyValue]: ...


class MetadataStore(abc.ABC):
    """Abstract etcd-shaped store. See the module docstring for the semantics."""

    #: Several OS processes may open the same store at once.
    multi_process: bool = True
    #: ``compact`` discards history older than a revision.
    supports_compaction: bool = True

    @abc.abstractmethod
    def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        """Write ``key``; returns the new store revision."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; returns how many."""

    @abc.abstractmethod
    def range(self, prefix: str, limit: int = 0, start_after: str | None = None) -> list[KeyValue]:
        """Keys under ``prefix`` in key order, at most ``limit`` (0 = all), after ``start_after``."""

    @abc.abstractmethod
    def snapshot(self) -> AbstractContextManager[ReadView]:
        """A view whose ``get`` and ``range`` all see the store as of one revision.
        Separate plain reads can each see a different moment: an operator's two writes
        made in order (a broker set active, then a topic requested on it) could be seen
        as the second without the first. Use the view only inside the ``with``."""

    @abc.abstractmethod
    def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult: ...

    @abc.abstractmethod
    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        """Watch ``prefix`` from ``start_revision`` (default: the next write)."""

    @abc.abstractmethod
    def current_revision(self) -> int: ...

    @abc.abstractmethod
    def compact(self, revision: int) -> None:
        """Forget history older than ``revision``; later watches from below it fail."""

    @abc.abstractmethod
    def grant_lease(self, ttl_s: float) -> Lease: ...

    @abc.abstractmethod
    def refresh_lease(self, lease_id: int) -> None:
        """Keep a lease alive for another TTL; LeaseNotFound if it already expired."""

    @abc.abstractmethod
    def revoke_lease(self, lease_id: int) -> None:
        """End a lease now, deleting its keys."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> "MetadataStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "Compare",
    "CompareOp",
    "CompareTarget",
    "Delete",
    "DeleteEvent",
    "Event",
    "Get",
    "KeyValue",
    "Lease",
    "MetadataStore",
    "Op",
    "Put",
    "PutEvent",
    "StorageError",
    "TxnResult",
    "Watch",
    "absent",
    "check_key",
    "check_ops",
    "create_revision_is",
    "mod_revision_is",
    "prefix_end",
    "value_is",
    "version_is",
]
