"""Fault injection for metadata stores (and, via :class:`FaultPlan`, object stores).

Wrap a real store; arm faults; the wrapper fails matching calls in a controlled way::

    store = FaultyMetadataStore(SqliteMetadataStore(path))
    store.faults.fail("txn", nth=2)                    # 2nd txn raises StorageUnavailable
    store.faults.fail("put", error=OperationTimeout, when="after")  # applied, then "times out"
    store.faults.add_latency(0.05, op="get")

``when="after"`` runs the real call first and then raises: the write happened but the
caller cannot know, which is the case retry logic must survive. ``delay_write`` is the
nastier twin seen on a paused etcd member: the caller gets a timeout *now*, and the
request is applied *later* (``apply_delayed()``), after whatever the caller did next. Every fault is
bounded (``times``); sleeps are bounded by what the test passes in.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, NoReturn, TypeVar

from tiered.errors import OperationTimeout, StorageError, StorageUnavailable
from tiered.metadata.base import Compare, KeyValue, Lease, MetadataStore, Op, ReadView, TxnResult, Watch

T = TypeVar("T")


@dataclass
class Fault:
    op: str | None  # method name, or None for every call
    nth: int | None  # fail only the nth matching call (1-based); None = from now on
    error: type[StorageError]
    when: Literal["before", "after"]
    times: int | None  # how many calls to fail at most; None = unbounded
    delay_s: float = 0.0  # sleep before raising (e.g. to mimic a timeout)
    kind: str = "error"  # "error" or "tear" (object stores)
    seen: int = 0
    fired: int = 0


class FaultPlan:
    """Armed faults and call counters, shared by the metadata and object wrappers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._latency: dict[str | None, float] = {}
        self.calls: Counter[str] = Counter()
        self.delayed: list[Callable[[], object]] = []

    def fail(
        self,
        op: str | None = None,
        *,
        nth: int | None = None,
        error: type[StorageError] = StorageUnavailable,
        when: Literal["before", "after"] = "before",
        times: int | None = None,
        delay_s: float = 0.0,
    ) -> Fault:
        """Make matching calls raise ``error``. ``nth`` counts calls from now."""
        if nth is not None and times is None:
            times = 1
        fault = Fault(op, nth, error, when, times, delay_s)
        with self._lock:
            self._faults.append(fault)
        return fault

    def timeout(self, op: str | None = None, *, nth: int | None = None, delay_s: float = 0.05, when: Literal["before", "after"] = "before") -> Fault:
        """Calls hang for ``delay_s`` and then raise OperationTimeout."""
        return self.fail(op, nth=nth, error=OperationTimeout, when=when, delay_s=delay_s)

    def tear(self, op: str = "put", *, nth: int | None = None, times: int | None = 1) -> Fault:
        """Object stores: the put leaves a truncated object and raises StorageUnavailable."""
        fault = self.fail(op, nth=nth, times=times)
        fault.kind = "tear"
        return fault

    def delay_write(self, op: str = "txn", *, nth: int | None = None, times: int | None = 1) -> Fault:
        """The call raises OperationTimeout at once and is kept, unapplied, until
        :meth:`apply_delayed` runs it (a request stuck in a paused member)."""
        fault = self.fail(op, nth=nth, error=OperationTimeout, times=times)
        fault.kind = "delay"
        return fault

    def apply_delayed(self) -> list[object]:
        """Apply every held request now, oldest first; returns their results."""
        with self._lock:
            held, self.delayed = self.delayed, []
        return [call() for call in held]

    def add_latency(self, latency_s: float, op: str | None = None) -> None:
        with self._lock:
            self._latency[op] = latency_s

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._latency.clear()

    def next_fault(self, op: str) -> Fault | None:
        """Count the call and return the fault that fires for it, if any."""
        with self._lock:
            self.calls[op] += 1
            hit = None
            for fault in self._faults:
                if fault.op not in (None, op):
                    continue
                fault.seen += 1
                if hit is not None or (fault.times is not None and fault.fired >= fault.times):
                    continue
                if fault.nth is None or fault.seen == fault.nth:
                    fault.fired += 1
                    hit = fault
            latency_s = self._latency.get(op, self._latency.get(None, 0.0))
        if latency_s:
            time.sleep(latency_s)
        return hit

    def run(self, op: str, call: Callable[[], T]) -> T:
        fault = self.next_fault(op)
        if fault is None:
            return call()
        return self.apply(op, fault, call)

    def apply(self, op: str, fault: Fault, call: Callable[[], object]) -> NoReturn:
        """Fire ``fault`` for one call: maybe run it first, maybe wait, then raise."""
        if fault.kind == "delay":
            with self._lock:
                self.delayed.append(call)
        elif fault.when == "after":
            call()
        if fault.delay_s:
            time.sleep(fault.delay_s)
        raise fault.error(f"injected fault: {op} ({fault.error.__name__}, {fault.when} the call)")


class _FaultyView(ReadView):
    def __init__(self, inner: ReadView, faults: FaultPlan) -> None:
        self.inner = inner
        self.faults = faults
        self.revision = inner.revision

    def get(self, key: str) -> KeyValue | None:
        return self.faults.run("get", lambda: self.inner.get(key))

    def range(self, prefix: str, limit: int = 0, start_after: str | None = None) -> list[KeyValue]:
        return self.faults.run("range", lambda: self.inner.range(prefix, limit, start_after))


class FaultyMetadataStore(MetadataStore):
    """A :class:`MetadataStore` that delegates to ``inner`` through a :class:`FaultPlan`."""

    def __init__(self, inner: MetadataStore, plan: FaultPlan | None = None) -> None:
        self.inner = inner
        self.faults = plan or FaultPlan()
        self.multi_process = inner.multi_process
        self.supports_compaction = inner.supports_compaction

    def get(self, key: str) -> KeyValue | None:
        return self.faults.run("get", lambda: self.inner.get(key))

    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        return self.faults.run("put", lambda: self.inner.put(key, value, lease_id))

    def delete(self, key: str) -> bool:
        return self.faults.run("delete", lambda: self.inner.delete(key))

    def delete_prefix(self, prefix: str) -> int:
        return self.faults.run("delete_prefix", lambda: self.inner.delete_prefix(prefix))

    def range(self, prefix: str, limit: int = 0, start_after: str | None = None) -> list[KeyValue]:
        return self.faults.run("range", lambda: self.inner.range(prefix, limit, start_after))

    @contextmanager
    def snapshot(self) -> Iterator[ReadView]:
        # The view's reads go through the plan as "get" and "range", like plain reads.
        with self.inner.snapshot() as view:
            yield _FaultyView(view, self.faults)

    def txn(self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()) -> TxnResult:
        return self.faults.run("txn", lambda: self.inner.txn(compare, success, failure))

    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        return self.faults.run("watch_prefix", lambda: self.inner.watch_prefix(prefix, start_revision))

    def current_revision(self) -> int:
        return self.faults.run("current_revision", self.inner.current_revision)

    def compact(self, revision: int) -> None:
        return self.faults.run("compact", lambda: self.inner.compact(revision))

    def grant_lease(self, ttl_s: float) -> Lease:
        return self.faults.run("grant_lease", lambda: self.inner.grant_lease(ttl_s))

    def refresh_lease(self, lease_id: int) -> None:
        return self.faults.run("refresh_lease", lambda: self.inner.refresh_lease(lease_id))

    def revoke_lease(self, lease_id: int) -> None:
        return self.faults.run("revoke_lease", lambda: self.inner.revoke_lease(lease_id))

    def close(self) -> None:
        self.inner.close()
