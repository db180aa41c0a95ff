"""Leader election through the metadata store, and the fence every load-manager write
carries.

**Campaign.** A candidate grants a lease and creates ``/cluster/leader`` under it with
create-if-absent (``absent(key)``): one winner per vacancy, on SQLite and etcd alike.
The key's ``create_revision`` is the **term**: it grows with every election, and no two
terms share one.

**Fence.** Every write of the leader is one transaction that also compares the leader
key's value (unique per campaign: it carries a nonce) and its create revision
(:attr:`LeaderToken.fencing`). A leader that lost its lease, or whose key another
candidate has since recreated, changes nothing: its compare fails. Two candidates
believing they lead at once (a paused process) can therefore never both write.

**Stepping down before the lease can lapse.** A refresh sent at time ``t`` (``lease_clock``,
which counts suspend)
that succeeded keeps the lease alive on the server until at least ``t + ttl_s`` (its
countdown restarts when the request arrives, never before it was sent). The leader
counts itself leader only while more than ``margin_s`` of that is certain
(:meth:`LeaderElection.current` reads the clock, so a stalled thread cannot stretch it);
it steps down at once on ``LeaseNotFound``, and when a fenced write fails because the
key is no longer its own (:meth:`LeaderElection.check_lost`). This is the broker's
``ack_lease_margin_s`` rule applied to leadership.

**Followers** watch the key and campaign as soon as it is deleted (lease expiry or a
resignation), and at least every ``ttl_s / 3`` otherwise.

:meth:`LeaderElection.tick` does one step (campaign or refresh) and is what the thread
runs; tests drive it directly with a fake clock.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tiered.cluster import records
from tiered.cluster.errors import ClusterError
from tiered.errors import LeaseNotFound, StorageError
from tiered.logs import FailureLog
from tiered.metadata.base import (
    lease_clock,
    Compare,
    DeleteEvent,
    Get,
    MetadataStore,
    Put,
    absent,
    create_revision_is,
    value_is,
)

log = logging.getLogger(__name__)

LEADER_TTL_S_DEFAULT = 10.0


class NotLeader(ClusterError):
    """This process is not (or no longer certainly) the leader."""


@dataclass(frozen=True, slots=True)
class LeaderToken:
    """Proof of one term of leadership: the exact bytes written and the term."""

    broker_id: str
    term: int
    held_bytes: bytes
    lease_id: int
    elected_at: float  # wall clock, for operators and LeaderHealth

    @property
    def fencing(self) -> list[Compare]:
        """Compares every write of this leader must include."""
        return [value_is(records.LEADER_KEY, self.held_bytes), create_revision_is(records.LEADER_KEY, self.term)]


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """What ``dnb cluster leader`` shows."""

    broker_id: str
    term: int
    elected_at: float
    lease_id: int


def read_leader(metadata: MetadataStore) -> LeaderInfo | None:
    kv = metadata.get(records.LEADER_KEY)
    if kv is None:
        return None
    record = records.decode(records.LeaderRecord, kv.key, kv.value)
    return LeaderInfo(record.broker_id, kv.create_revision, record.elected_at, kv.lease_id)


class LeaderElection:
    def __init__(self, metadata: MetadataStore, candidate_id: str, ttl_s: float = LEADER_TTL_S_DEFAULT,
                 margin_s: float | None = None, clock: Callable[[], float] = lease_clock,
                 wall_clock: Callable[[], float] = time.time,
                 on_change: Callable[[LeaderToken | None], None] | None = None) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        margin_s = ttl_s / 3 if margin_s is None else margin_s
        if not 0 <= margin_s < ttl_s:
            raise ValueError("margin_s must be in [0, ttl_s)")
        self.metadata = metadata
        self.candidate_id = candidate_id
        self.ttl_s = ttl_s
        self.margin_s = margin_s
        self.clock = clock
        self.wall_clock = wall_clock
        self.on_change = on_change
        self._lock = threading.Lock()
        self._token: LeaderToken | None = None
        self._valid_until = 0.0  # monotonic: the lease certainly lives until then
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch = None
        self.refresh_failures = 0
        #: Wall time since when every refresh has worked (None while one is failing): the
        #: failover grace is longer until the session has been stable for a while.
        self.healthy_since: float | None = None
        #: (monotonic time, reason) of every step-down, for logs and tests.
        self.step_downs: list[tuple[float, str]] = []
        # Each retried activity logs its first failure with the cause, repeats at most
        # every 30 s and its recovery once (tiered/logs.py).
        self._refresh_log = FailureLog(log, f"load manager {candidate_id}: leader lease refresh")
        self._step_log = FailureLog(log, f"load manager {candidate_id}: election step")
        self._watch_log = FailureLog(log, f"load manager {candidate_id}: leader watch")

    # -- queries ----------------------------------------------------------------------
    def current(self) -> LeaderToken | None:
        """The token while leadership is certain (more than ``margin_s`` of lease left)."""
        with self._lock:
            if self._token is not None and self.clock() < self._valid_until - self.margin_s:
                return self._token
        return None

    def is_leader(self) -> bool:
        return self.current() is not None

    def remaining_s(self) -> float:
        """Seconds of lease certainly left (<= 0: none)."""
        with self._lock:
            return self._valid_until - self.clock() if self._token is not None else 0.0

    # -- steps ------------------------------------------------------------------------
    def tick(self) -> float:
        """One step: campaign when not leader, refresh when leader. Returns how long to
        wait before the next step."""
        with self._lock:
            token = self._token
        if token is None:
            self._campaign()
        else:
            self._refresh(token)
        with self._lock:
            if self._token is None:
                return self.ttl_s / 3
            until_margin = self._valid_until - self.margin_s - self.clock()
        return max(0.0, min(self.ttl_s / 3, until_margin))

    def _campaign(self) -> None:
        sent = self.clock()
        lease = self.metadata.grant_lease(self.ttl_s)
        record = records.LeaderRecord(self.candidate_id, self.wall_clock(), os.urandom(8).hex())
        body = records.encode(record)
        try:
            result = self.metadata.txn([absent(records.LEADER_KEY)], [Put(records.LEADER_KEY, body, lease.id)],
                                       [Get(records.LEADER_KEY)])
        except BaseException:
            self._revoke_quietly(lease.id)
            raise
        if not result.succeeded:
            self._revoke_quietly(lease.id)
            return
        token = LeaderToken(self.candidate_id, result.revision, body, lease.id, record.elected_at)
        with self._lock:
            self._token = token
            self._valid_until = sent + self.ttl_s
        self.refresh_failures = 0
        self.healthy_since = record.elected_at
        log.info("load manager: %s is leader (term %d)", self.candidate_id, token.term)
        self._notify(token)

    def _refresh(self, token: LeaderToken) -> None:
        sent = self.clock()
        try:
            self.metadata.refresh_lease(token.lease_id)
        except LeaseNotFound:
            self._step_down(token, "leader lease lapsed")
            return
        except StorageError as e:
            self.refresh_failures += 1
            self.healthy_since = None
            self._refresh_log.failed(e, f"failed ({self.remaining_s():.1f}s of the lease certain)")
        else:
            self._refresh_log.succeeded()
            with self._lock:
                if self._token is token:
                    self._valid_until = sent + self.ttl_s
            self.refresh_failures = 0
            if self.healthy_since is None:
                self.healthy_since = self.wall_clock()
        if self.clock() >= self._valid_until - self.margin_s:
            self._step_down(token, "cannot refresh the leader lease in time")

    def check_lost(self, token: LeaderToken) -> bool:
        """After a fenced write failed: step down if the leader key is not ours any
        more (True), or stay (False: the write failed on another compare)."""
        try:
            kv = self.metadata.get(records.LEADER_KEY)
        except StorageError:
            return not self.is_leader()
        if kv is not None and kv.value == token.held_bytes and kv.create_revision == token.term:
            return False
        self._step_down(token, "the leader key is no longer ours")
        return True

    def resign(self) -> None:
        """Give up leadership now (deleting the key lets a follower win at once)."""
        with self._lock:
            token = self._token
        if token is not None:
            self._step_down(token, "resigned")

    def _step_down(self, token: LeaderToken, reason: str) -> None:
        with self._lock:
            if self._token is not token:
                return
            self._token = None
            self._valid_until = 0.0
            self.step_downs.append((self.clock(), reason))
        log.warning("load manager: %s steps down from term %d: %s", self.candidate_id, token.term, reason)
        self._revoke_quietly(token.lease_id)  # our key goes now rather than at expiry
        self._notify(None)

    def _revoke_quietly(self, lease_id: int) -> None:
        try:
            self.metadata.revoke_lease(lease_id)
        except StorageError as e:
            log.info("load manager: revoking lease %x failed (it will expire): %s", lease_id, e)

    def _notify(self, token: LeaderToken | None) -> None:
        if self.on_change is not None:
            try:
                self.on_change(token)
            except Exception:  # noqa: BLE001 - a callback must not stop the election
                log.exception("load manager: leader change callback failed")

    # -- thread -----------------------------------------------------------------------
    def start(self) -> "LeaderElection":
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"dnb-lm-elect-{self.candidate_id}")
        self._thread.start()
        return self

    def stop(self, resign: bool = True) -> None:
        self._stop.set()
        self._wake.set()
        watch = self._watch
        if watch is not None:
            watch.cancel()
        if self._thread is not None:
            self._thread.join(self.ttl_s + 5.0)
        if resign:
            self.resign()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delay_s = self.tick()
                self._step_log.succeeded()
            except Exception as e:  # noqa: BLE001 - the election must outlive one bad step
                if isinstance(e, StorageError):
                    self._step_log.failed(e)
                else:
                    self._step_log.failed(e, level=logging.ERROR, exc_info=True)
                delay_s = self.ttl_s / 3
                with self._lock:
                    token = self._token
                if token is not None and self.clock() >= self._valid_until - self.margin_s:
                    self._step_down(token, f"cannot reach the metadata store ({e})")
            if self._stop.is_set():
                return
            if self.is_leader():
                self._wake.wait(delay_s)
                self._wake.clear()
            else:
                self._wait_vacancy(delay_s)

    def _wait_vacancy(self, timeout_s: float) -> None:
        """Wait until the leader key is deleted (or ``timeout_s``)."""
        try:
            if self._watch is None or self._watch.cancelled:
                self._watch = self.metadata.watch_prefix(records.LEADER_KEY)
                vacant = self.metadata.get(records.LEADER_KEY) is None
                self._watch_log.succeeded()  # the read behind the new watch worked
                if vacant:
                    return  # vacant already: campaign now
            deadline = self.clock() + timeout_s
            while not self._stop.is_set():
                left = deadline - self.clock()
                if left <= 0:
                    return
                event = self._watch.get(timeout_s=min(left, 0.5))
                if isinstance(event, DeleteEvent) and event.key == records.LEADER_KEY:
                    return
        except StorageError as e:
            self._watch_log.failed(e, "failed; polling", level=logging.INFO)
            if self._watch is not None:
                self._watch.cancel()
            self._watch = None
            self._stop.wait(timeout_s)
