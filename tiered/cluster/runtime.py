"""The load manager's runtime: while leader, read stored state, ask the decision core,
carry the answer out as fenced compare-and-swaps.

One :meth:`LoadManager.step`:

1. ``current()`` of the election; not leader → forget everything and return.
2. :func:`~tiered.cluster.observe.read_snapshot` (range reads, never remembered events).
3. **Observe** what brokers did (no decision needed): adopt assignments that have no
   placement record (an operator's ``dnb move``/``assign``), and turn ``assigning`` into
   ``owned`` once the owner record says the assignee holds the topic (completing the
   move's history entry); roll a release back to a source that restarted, and give an
   ``assigning`` topic back to a live holder that restarted and forgot it
   (:meth:`Executor.give_back`). Any such write → read again.
4. ``decide(view, config, state, now)`` and :class:`Executor` for each action.

Every write is one transaction whose compares include the leader fence
(:attr:`LeaderToken.fencing`) and the ``mod_revision`` of each record the decision was
based on; a write whose fence fails makes the runtime ask the election whether it
still leads (it steps down if not) and abandon the rest of the step. A write that
lost only its CAS is skipped: the next step re-reads and decides again.

Invariants the transactions keep (and tests check):

* **I1** one assignment key per topic: assignments change only in the same txn as the
  placement CAS, and a target is written in the txn that deletes the source's.
* **I2** a move's target is assigned only once the source released (the owner record's
  ``mod_revision`` is compared, so the release observed is the release in force), and
  a failover only while the old broker's registration is absent (``absent`` compare).
* **I3** never ``force``, never ``/storage/*`` or cursors, never a delete of data.
* **I4** every write fenced by the leader record.

The loop wakes on changes under ``/cluster/`` (except load reports) and on owner/state
records under ``/storage/topics/``, and at least every ``poll_interval_s`` or when the
core asks (``next_wakeup_at``); rebalancing checks run on the core's own schedule.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry

from tiered.cluster import records
from tiered.cluster.actions import (
    Action,
    AnswerRebalance,
    Assign,
    CompleteTransfer,
    Decision,
    DropMarker,
    MarkDrained,
    Reassign,
    RejectRequest,
    RetryAssign,
    Transfer,
)
from tiered.cluster.config import LoadManagerConfig
from tiered.cluster.errors import ClusterError
from tiered.cluster.decide import decide
from tiered.cluster.history import FUTURE_SKEW_S
from tiered.cluster.leader import LeaderElection, LeaderToken
from tiered.cluster.metrics import LoadManagerMetrics
from tiered.cluster.observe import Snapshot, ViewBuilder, read_snapshot
from tiered.cluster.view import CoreState, LeaderHealth, MoveKind
from tiered.errors import StorageError
from tiered.lifecycle.ownership import owner_key, registered_key
from tiered.logs import FailureLog
from tiered.metadata import keys
from tiered.metadata.base import (
    Compare,
    Delete,
    Get,
    MetadataStore,
    Op,
    Put,
    absent,
    create_revision_is,
    mod_revision_is,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    leader_ttl_s: float = 10.0
    #: None: a third of the TTL (like the broker's ``ack_lease_margin_s``).
    leader_margin_s: float | None = None
    #: Upper bound on the time between two steps when nothing wakes the loop.
    poll_interval_s: float = 5.0
    #: After a wake-up, wait this long for more events to coalesce.
    debounce_s: float = 0.02
    #: Move history is pruned past this age or count (never entries of the last hour,
    #: which the hourly limit, cooldowns and the ping-pong window read, nor open ones).
    history_retention_s: float = 7 * 86_400.0
    history_entries_max: int = 10_000


@dataclass
class StepReport:
    """What one step did (for tests, logs and ``dnb cluster`` output)."""

    leader: bool
    term: int | None = None
    observed: int = 0
    decision: Decision | None = None
    applied: list = None  # type: ignore[assignment]
    refused: list = None  # type: ignore[assignment]
    fenced: bool = False

    def __post_init__(self) -> None:
        self.applied = [] if self.applied is None else self.applied
        self.refused = [] if self.refused is None else self.refused


class Fenced(ClusterError):
    """A write's leader fence failed: this process is no longer the leader."""


def _assign_value(reason: str | None, now: float) -> bytes:
    return keys.Assignment(now, reason).to_json()


class Executor:
    """Turns one action into one fenced transaction. Returns True if it landed, False
    if a CAS failed (state moved on), raises :class:`Fenced` if the fence failed."""

    def __init__(self, metadata: MetadataStore, clock: Callable[[], float] = time.time) -> None:
        self.metadata = metadata
        self.clock = clock

    def apply(self, action: Action, snap: Snapshot, token: LeaderToken) -> bool:
        handler = getattr(self, "_" + type(action).__name__)
        return handler(action, snap, token)

    # -- the transaction ---------------------------------------------------------------
    def txn(self, token: LeaderToken, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        result = self.metadata.txn([*token.fencing, *compares], list(ops), [Get(records.LEADER_KEY)])
        if result.succeeded:
            return True
        leader = result.responses[0] if result.responses else None
        if leader is None or leader.value != token.held_bytes or leader.create_revision != token.term:
            raise Fenced(f"term {token.term} is over")
        return False

    # -- helpers -----------------------------------------------------------------------
    @staticmethod
    def _placement_guard(snap: Snapshot, topic: str) -> list[Compare]:
        held = snap.placements.get(topic)
        key = records.placement_key(topic)
        return [absent(key)] if held is None else [mod_revision_is(key, held[1])]

    @staticmethod
    def _marker_ops(snap: Snapshot, topic: str) -> list[Op]:
        return [Delete(keys.unassigned_key(topic))] if topic in snap.markers else []

    def _placement(self, snap: Snapshot, topic: str, token: LeaderToken, **fields) -> Put:
        now = self.clock()
        held = snap.placements.get(topic)
        created = held[0].created_at if held is not None else now
        base = records.PlacementRecord(state="free", broker=None, created_at=created, updated_at=now,
                                       term=token.term)
        record = replace(base, **fields)
        return Put(records.placement_key(topic), records.encode(record))

    def _history_put(self, token: LeaderToken, move_id: str, topic: str, from_broker: str | None,
                     to_broker: str, kind: str, reason: str, load: float) -> tuple[str, Put]:
        now = self.clock()
        record = records.HistoryRecord(move_id, topic, from_broker, to_broker, kind, reason, now, token.term,
                                       load, None, now)
        key = records.history_key(now, move_id)
        return key, Put(key, records.encode(record))

    # -- actions -----------------------------------------------------------------------
    def _Assign(self, a: Assign, snap: Snapshot, token: LeaderToken) -> bool:
        others = snap.assignments.get(a.topic, {})
        # I1: never a second assignment key (an unplaced one is adopted first).
        compares = [*self._placement_guard(snap, a.topic), Compare(registered_key(a.broker), "version", ">", 0),
                    *[absent(keys.assignment_key(b, a.topic)) for b in sorted(others) if b != a.broker]]
        ops = [self._placement(snap, a.topic, token, state="assigning", broker=a.broker, reason=a.reason),
               Put(keys.assignment_key(a.broker, a.topic), _assign_value(a.reason, self.clock())),
               *self._marker_ops(snap, a.topic)]
        return self.txn(token, compares, ops)

    def _Transfer(self, a: Transfer, snap: Snapshot, token: LeaderToken) -> bool:
        move_id = f"t{token.term}-{a.move_id}"
        hkey, hput = self._history_put(token, move_id, a.topic, a.from_broker, a.to_broker, a.kind.value,
                                       a.kind.value, a.estimated_load)
        marker = keys.Unassigned(a.kind.value, a.from_broker, a.to_broker)
        ops = [self._placement(snap, a.topic, token, state="releasing", broker=a.from_broker, target=a.to_broker,
                               move_id=move_id, kind=a.kind.value, reason=a.kind.value, history_key=hkey),
               Put(keys.unassigned_key(a.topic), marker.to_json()),
               Delete(keys.assignment_key(a.from_broker, a.topic)), hput]
        compares = list(self._placement_guard(snap, a.topic))
        if a.rebalance_request is not None:
            # The move and the answer to the operator's request land together or not at
            # all: a request never makes two moves, even across leaders.
            moved = [{"topic": a.topic, "from": a.from_broker, "to": a.to_broker, "move_id": move_id,
                      "cv_before": a.cv_before, "cv_after": a.cv_after}]
            guard, put = self._answer(snap, token, a.rebalance_request, "moved", moved)
            compares.append(guard)
            ops.append(put)
        return self.txn(token, compares, ops)

    def _answer(self, snap: Snapshot, token: LeaderToken, request_id: str, outcome: str,
                moves: list) -> tuple[Compare, Put]:
        """The compare and write that answer the pending rebalance request ``request_id``."""
        held = snap.rebalance_request
        if held is None or held[0].request_id != request_id:
            raise ClusterError(f"rebalance request {request_id} is not the pending one")
        record, rev = held
        answered = replace(record, state="answered", outcome=outcome, moves=moves, term=token.term,
                           answered_at=self.clock())
        return (mod_revision_is(records.REBALANCE_REQUEST_KEY, rev),
                Put(records.REBALANCE_REQUEST_KEY, records.encode(answered)))

    def _AnswerRebalance(self, a: AnswerRebalance, snap: Snapshot, token: LeaderToken) -> bool:
        guard, put = self._answer(snap, token, a.request_id, a.outcome, [])
        return self.txn(token, [guard], [put])

    def _CompleteTransfer(self, a: CompleteTransfer, snap: Snapshot, token: LeaderToken) -> bool:
        held = snap.placements[a.topic][0]
        _, owner_rev = snap.owner(a.topic)
        okey = owner_key(a.topic)
        # The release we observed is the one in force (I2): the owner record is unchanged.
        owner_guard = absent(okey) if owner_rev == 0 else mod_revision_is(okey, owner_rev)
        compares = [*self._placement_guard(snap, a.topic), owner_guard,
                    Compare(registered_key(a.to_broker), "version", ">", 0)]
        ops = [self._placement(snap, a.topic, token, state="assigning", broker=a.to_broker, move_id=held.move_id,
                               kind=held.kind, reason=held.reason, history_key=held.history_key),
               Put(keys.assignment_key(a.to_broker, a.topic), _assign_value(held.reason, self.clock())),
               *self._marker_ops(snap, a.topic)]
        for b in sorted(snap.assignments.get(a.topic, {})):
            if b != a.to_broker:  # made by hand meanwhile: one assignment per topic (I1)
                ops.append(Delete(keys.assignment_key(b, a.topic)))
        if a.retargeted and held.history_key in snap.history:
            h = snap.history[held.history_key]
            ops.append(Put(held.history_key, records.encode(replace(h, to_broker=a.to_broker))))
        return self.txn(token, compares, ops)

    def _Reassign(self, a: Reassign, snap: Snapshot, token: LeaderToken) -> bool:
        held = snap.placements.get(a.topic)
        compares = list(self._placement_guard(snap, a.topic))
        ops: list[Op] = []
        if a.reason == MoveKind.FAILOVER.value:
            compares.append(absent(registered_key(a.from_broker)))  # I2: only while it is gone
            move_id = f"t{token.term}-{a.move_id}"
            history_key, hput = self._history_put(token, move_id, a.topic, a.from_broker, a.to_broker,
                                                  MoveKind.FAILOVER.value, a.reason, 0.0)
            kind: str | None = MoveKind.FAILOVER.value
            ops.append(hput)
        else:
            # A retarget continues the move under way (if any); it is not a move of its
            # own, so it neither writes history nor spends the hourly budget.
            move_id = held[0].move_id if held else None
            kind = held[0].kind if held else None
            history_key = held[0].history_key if held else None
            if history_key is not None and history_key in snap.history:
                h = snap.history[history_key]
                ops.append(Put(history_key, records.encode(replace(h, to_broker=a.to_broker))))
        ops += [self._placement(snap, a.topic, token, state="assigning", broker=a.to_broker, move_id=move_id,
                                kind=kind, reason=a.reason, history_key=history_key),
                Put(keys.assignment_key(a.to_broker, a.topic), _assign_value(a.reason, self.clock())),
                *self._marker_ops(snap, a.topic)]
        for b in sorted(snap.assignments.get(a.topic, {})):
            if b != a.to_broker:
                ops.append(Delete(keys.assignment_key(b, a.topic)))
        return self.txn(token, compares, ops)

    def _RetryAssign(self, a: RetryAssign, snap: Snapshot, token: LeaderToken) -> bool:
        held = snap.placements[a.topic][0]
        ops = [Put(records.placement_key(a.topic), records.encode(
                   replace(held, attempts=a.attempt, updated_at=self.clock(), term=token.term))),
               Put(keys.assignment_key(a.broker, a.topic), _assign_value(held.reason, self.clock()))]
        return self.txn(token, self._placement_guard(snap, a.topic), ops)

    def _DropMarker(self, a: DropMarker, snap: Snapshot, token: LeaderToken) -> bool:
        held = snap.markers.get(a.topic)
        if held is None:
            return False
        return self.txn(token, [mod_revision_is(keys.unassigned_key(a.topic), held[1])],
                        [Delete(keys.unassigned_key(a.topic))])

    def _MarkDrained(self, a: MarkDrained, snap: Snapshot, token: LeaderToken) -> bool:
        key = records.broker_state_key(a.broker)
        held = snap.modes.get(a.broker)
        if held is None or held[0].mode != "draining":
            return False
        record = records.BrokerStateRecord("drained", "no topic left", self.clock(), "load-manager")
        return self.txn(token, [mod_revision_is(key, held[1])], [Put(key, records.encode(record))])

    def _RejectRequest(self, a: RejectRequest, snap: Snapshot, token: LeaderToken) -> bool:
        log.warning("load manager: request %s rejected: %s", a.request_id, a.reason)
        return False

    # -- observations (not decisions) ----------------------------------------------------
    def adopt(self, snap: Snapshot, token: LeaderToken, topic: str) -> bool:
        """An assignment without a placement record (written by an operator helper):
        record it as owned (if the assignee holds it) or assigning."""
        brokers = snap.assignments[topic]
        owner, _ = snap.owner(topic)
        holder = owner.holder if owner is not None else None
        if len(brokers) > 1 and holder not in brokers:
            log.warning("load manager: topic %s is assigned to %s; waiting for one of them to own it",
                        topic, sorted(brokers))
            return False
        broker = holder if holder in brokers else next(iter(brokers))
        state = "owned" if holder == broker else "assigning"
        compares = [absent(records.placement_key(topic)),
                    mod_revision_is(keys.assignment_key(broker, topic), brokers[broker])]
        ops = [self._placement(snap, topic, token, state=state, broker=broker, reason="adopted")]
        return self.txn(token, compares, ops)

    def roll_back(self, snap: Snapshot, token: LeaderToken, topic: str) -> bool:
        """``releasing`` → ``assigning`` back to the source (see ``_observe``), fenced on
        the source's registration being the restarted incarnation we saw and still
        holding the topic."""
        held, _ = snap.placements[topic]
        source = held.broker
        log.warning("load manager: %s restarted while releasing %s; rolling the move back", source, topic)
        return self._return_to_holder(snap, token, topic, source, "rolled back", "rolled back: the source restarted",
                                      extra_ops=self._marker_ops(snap, topic))

    def give_back(self, snap: Snapshot, token: LeaderToken, topic: str, holder: str) -> bool:
        """``assigning`` another broker → ``assigning`` the live holder (see ``_observe``).

        Precondition (each part compared in the transaction, or read from the same
        snapshot): the placement is ``assigning`` to a broker other than ``holder`` and
        unchanged (``mod_revision``); the owner record, unchanged, names ``holder`` and is
        not released (nobody else took the topic over, so nothing was numbered past the
        holder's WAL); ``holder`` is registered, the incarnation we saw
        (``create_revision``), so no other broker can take the topic while this holds;
        ``holder`` has no assignment key for the topic (``absent``); and ``holder`` forgot
        the topic (``_forgot``: registered after the placement last changed, or its later
        load report does not list it), so it is neither hosting nor sealing it: a holder
        sealing for a move (that will release) is left alone. The topic goes to the one
        broker that can serve it: its load is a restart by the same broker and recovers
        its own WAL. The other assignment keys are deleted in the same transaction
        (compared on their ``mod_revision``), so there is still one per topic (I1); the
        move's history entry is completed (to the holder)."""
        held, _ = snap.placements[topic]
        assigned = snap.assignments.get(topic, {})
        log.warning("load manager: %s holds %s (restarted) but it is assigned to %s; giving it back to %s",
                    holder, topic, held.broker, holder)
        return self._return_to_holder(
            snap, token, topic, holder, "given back", f"given back: {holder} restarted holding it",
            extra_ops=[Delete(keys.assignment_key(b, topic)) for b in sorted(assigned)],
            extra_compares=[mod_revision_is(keys.assignment_key(b, topic), rev) for b, rev in sorted(assigned.items())])

    def _return_to_holder(self, snap: Snapshot, token: LeaderToken, topic: str, holder: str, reason: str,
                          history_note: str, extra_ops: list[Op], extra_compares: list | None = None) -> bool:
        """The transaction shared by :meth:`roll_back` and :meth:`give_back`: placement
        ``assigning holder`` (move fields cleared), the holder's assignment written, the
        move's history entry completed to it; compared on the placement, the owner record
        (unchanged, so still the holder's), the holder's registration incarnation and its
        assignment being absent (each caller states why these hold)."""
        held, _ = snap.placements[topic]
        _, owner_rev = snap.owner(topic)
        reg = snap.registered[holder]
        now = self.clock()
        ops: list[Op] = [
            Put(records.placement_key(topic), records.encode(replace(
                held, state="assigning", broker=holder, target=None, move_id=None, kind=None, history_key=None,
                attempts=0, reason=reason, updated_at=now, term=token.term))),
            Put(keys.assignment_key(holder, topic), _assign_value(reason, now)),
            *extra_ops]
        if held.history_key is not None and held.history_key in snap.history:
            h = snap.history[held.history_key]
            ops.append(Put(held.history_key, records.encode(replace(
                h, to_broker=holder, reason=f"{h.reason}; {history_note}", completed_at=now))))
        compares = [*self._placement_guard(snap, topic), mod_revision_is(owner_key(topic), owner_rev),
                    create_revision_is(registered_key(holder), reg.create_revision),
                    absent(keys.assignment_key(holder, topic)), *(extra_compares or [])]
        return self.txn(token, compares, ops)

    def readopt(self, snap: Snapshot, token: LeaderToken, topic: str) -> bool:
        """An ``owned`` placement whose broker lost its assignment while an operator
        assigned the topic to another broker (``dnb move`` racing the leader): the
        placement follows the operator's assignment."""
        brokers = snap.assignments[topic]
        if len(brokers) != 1:
            log.warning("load manager: topic %s is assigned to %s by hand; waiting", topic, sorted(brokers))
            return False
        [(broker, rev)] = brokers.items()
        held, _ = snap.placements[topic]
        ops = [Put(records.placement_key(topic), records.encode(
            replace(held, state="assigning", broker=broker, attempts=0, target=None, updated_at=self.clock(),
                    term=token.term, reason="adopted")))]
        return self.txn(token, [*self._placement_guard(snap, topic),
                                mod_revision_is(keys.assignment_key(broker, topic), rev)], ops)

    def restore_assignment(self, snap: Snapshot, token: LeaderToken, topic: str) -> bool:
        """An ``owned`` placement whose assignment key vanished without a move (deleted by
        hand; the broker's watcher sealed the topic): give it back to the same broker,
        as ``assigning`` until that broker holds it again."""
        held, _ = snap.placements[topic]
        key = keys.assignment_key(held.broker, topic)
        log.warning("load manager: topic %s is placed on %s but not assigned there; re-assigning it",
                    topic, held.broker)
        ops = [Put(records.placement_key(topic), records.encode(
                   replace(held, state="assigning", attempts=0, updated_at=self.clock(), term=token.term))),
               Put(key, _assign_value("repair", self.clock()))]
        return self.txn(token, [*self._placement_guard(snap, topic), absent(key)], ops)

    def confirm_owned(self, snap: Snapshot, token: LeaderToken, topic: str, holder: str | None = None) -> bool:
        """``assigning`` → ``owned`` once the assignee holds the topic (or, ``holder``
        given, once another broker holds it with the only assignment: a move finished by
        hand); completes the move's history entry."""
        held, _ = snap.placements[topic]
        broker = holder or held.broker
        _, owner_rev = snap.owner(topic)
        ops: list[Op] = [Put(records.placement_key(topic), records.encode(
            replace(held, state="owned", broker=broker, attempts=0, updated_at=self.clock(), term=token.term,
                    target=None)))]
        if held.history_key is not None and held.history_key in snap.history:
            h = snap.history[held.history_key]
            ops.append(Put(held.history_key, records.encode(replace(h, to_broker=broker,
                                                                    completed_at=self.clock()))))
        compares = [*self._placement_guard(snap, topic), mod_revision_is(owner_key(topic), owner_rev),
                    mod_revision_is(keys.assignment_key(broker, topic), snap.assignments[topic][broker])]
        return self.txn(token, compares, ops)


def _balance_text(b) -> str:
    """The scores' CV, and CPU's CV and hottest broker when a check computed them."""
    if b is None:
        return "-"
    if b.cpu_cv is None:
        return f"{b.cv:.3f}"
    return f"{b.cv:.3f}, CPU CV {b.cpu_cv:.3f}, hottest CPU {b.cpu_hot:+.0%} of the mean"


def _forgot(snap: Snapshot, topic: str, p: records.PlacementRecord, broker: str | None = None) -> bool:
    """Whether the source of a release (or ``broker``, the holder of an ``assigning``
    topic) can no longer be sealing ``topic``: it registered again after the placement
    last changed, or its load report written after that does not list the topic (a
    broker lists every topic it hosts, sealing ones included)."""
    source = broker or p.broker
    if snap.registered[source].create_revision > snap.placements[topic][1]:
        return True
    report = snap.reports.get(source)
    return report is not None and report.ts > p.updated_at and \
        topic not in {t.topic for t in report.topic_reports()}


class LoadManager:
    """The runtime loop around :func:`~tiered.cluster.decide` (see the module docstring)."""

    def __init__(self, metadata: MetadataStore, node_id: str, config: LoadManagerConfig | None = None,
                 runtime: RuntimeConfig | None = None, election: LeaderElection | None = None,
                 clock: Callable[[], float] = time.time, metrics: LoadManagerMetrics | None = None) -> None:
        self.metadata = metadata
        self.node_id = node_id
        self.config = config or LoadManagerConfig()
        self.runtime = runtime or RuntimeConfig()
        self.clock = clock
        self.election = election or LeaderElection(metadata, node_id, self.runtime.leader_ttl_s,
                                                   self.runtime.leader_margin_s, on_change=self._on_leader_change)
        if election is not None and election.on_change is None:
            election.on_change = self._on_leader_change
        self.executor = Executor(metadata, clock)
        #: The seed's metrics (a private registry unless the caller passes the process's).
        self.metrics = metrics or LoadManagerMetrics(CollectorRegistry())
        self._term: int | None = None
        self._state: CoreState | None = None
        self._views = ViewBuilder(self.config)
        self._next_wakeup: float | None = None
        self._last_skipped: tuple[str, ...] = ()
        #: Alarms logged and not cleared since (kind, subject): each is logged when raised.
        self._logged_alarms: set[tuple[str, str]] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list = []
        self.last: StepReport | None = None
        #: Called after every step (tests wait on it).
        self.on_step: Callable[[StepReport], None] | None = None
        self.fenced_writes = 0
        # First failure with its cause, repeats at most every 30 s, one recovery line.
        self._step_failures = FailureLog(log, f"load manager {node_id}: step")
        self._watch_failures: dict[str, FailureLog] = {}

    # -- one step ------------------------------------------------------------------------
    def step(self) -> StepReport:
        token = self.election.current()
        self.metrics.is_leader.set(0 if token is None else 1)
        self.metrics.term.set(0 if token is None else token.term)
        if token is None:
            self._forget()
            return StepReport(leader=False)
        if token.term != self._term:
            self._forget()
            self._term = token.term
            log.info("load manager: %s leads term %d; reconciling from stored state", self.node_id, token.term)
        report = StepReport(leader=True, term=token.term)
        try:
            snap = read_snapshot(self.metadata)
            report.observed = self._observe(snap, token) + self._prune_history(snap, token)
            if report.observed:
                snap = read_snapshot(self.metadata)
            now = self.clock()
            config = self.config
            if snap.overrides.paused:
                config = config.with_rebalancing(paused=True)
            # A refresh failing now suspends failovers (the core's rule); one that failed
            # recently lengthens their grace until the session is stable again.
            since = self.election.healthy_since
            health = LeaderHealth(since is not None, since)
            view = self._views.build(snap, now, health)
            started = time.monotonic()
            decision = decide(view, config, self._state, now)
            self.metrics.observe(decision, view, time.monotonic() - started)
            self._state = decision.state
            self._next_wakeup = decision.next_wakeup_at
            if decision.checked and tuple(decision.skipped) != self._last_skipped:
                self._last_skipped = tuple(decision.skipped)
                log.info("load manager (term %d): rebalancing check: %s (CV %s)", token.term,
                         ", ".join(decision.skipped) or "moving", _balance_text(decision.balance))
            report.decision = decision
            alarms = {(a.kind, a.subject): a for a in decision.alarms}
            for key in alarms.keys() - self._logged_alarms:  # transitions, not one line per step
                alarm = alarms[key]
                log.warning("load manager alarm %s on %s: %s", alarm.kind, alarm.subject, alarm.detail)
            for kind, subject in self._logged_alarms - alarms.keys():
                log.info("load manager alarm %s on %s cleared", kind, subject)
            self._logged_alarms = set(alarms)
            for action in decision.actions:
                if self.election.current() is not token:
                    raise Fenced("leadership ended during the step")
                if self.executor.apply(action, snap, token):
                    report.applied.append(action)
                    log.info("load manager (term %d): %s", token.term, action)
                else:
                    report.refused.append(action)
                    self.metrics.refused.inc()
        except Fenced as e:
            self.fenced_writes += 1
            self.metrics.fenced.inc()
            report.fenced = True
            log.warning("load manager: write refused by the leader fence (%s)", e)
            self.election.check_lost(token)
            self._forget()
        return report

    def _observe(self, snap: Snapshot, token: LeaderToken) -> int:
        done = 0
        for topic in sorted(snap.assignments):
            if topic not in snap.placements and self.executor.adopt(snap, token, topic):
                done += 1
        for topic, (p, _) in sorted(snap.placements.items()):
            assigned = snap.assignments.get(topic, {})
            if p.state == "owned" and p.broker not in assigned and topic not in snap.markers:
                # Deleted by hand (no move made by us deletes it without a marker): give it
                # back, unless an operator assigned the topic elsewhere: then follow that.
                landed = self.executor.readopt(snap, token, topic) if assigned else \
                    self.executor.restore_assignment(snap, token, topic)
                done += int(landed)
                continue
            if p.state not in ("assigning", "releasing"):
                continue
            owner, _ = snap.owner(topic)
            holder = owner.holder if owner is not None else None
            if p.state == "releasing" and holder == p.broker and holder in snap.registered and not assigned \
                    and _forgot(snap, topic, p):
                # The source restarted around the move's start: its new incarnation never
                # saw the unassignment, so it will never seal. Roll the move back (it
                # reloads its own WAL, losing nothing); the rules may move it again later.
                done += int(self.executor.roll_back(snap, token, topic))
                continue
            if p.state == "assigning" and holder is not None and holder != p.broker and holder in snap.registered \
                    and holder not in assigned and _forgot(snap, topic, p, holder):
                # The holder restarted after the topic was given to another broker (a
                # failover's Reassign landed, then the same id came back before the target
                # loaded it): the target's load is refused (the holder is live), and the
                # holder, with no assignment, never loads or seals it. Give the topic back
                # to the holder (it recovers its own WAL, losing nothing). Precondition: the
                # holder is live (registered, that incarnation compared), holds the topic
                # (owner record unreleased and unchanged), has no assignment, and forgot
                # the topic (so it is not sealing it for a move); see give_back.
                done += int(self.executor.give_back(snap, token, topic, holder))
                continue
            if holder is None or holder not in snap.registered or set(assigned) != {holder}:
                continue
            if p.state == "assigning" and holder == p.broker:
                done += int(self.executor.confirm_owned(snap, token, topic))
            elif holder != p.broker:
                # The move was finished by someone else (an operator's assign after the
                # seal): the placement follows the broker that holds the topic now.
                done += int(self.executor.confirm_owned(snap, token, topic, holder))
        return done

    def _prune_history(self, snap: Snapshot, token: LeaderToken, batch_max: int = 64) -> int:
        now = self.clock()
        keep_after = now - max(self.runtime.history_retention_s, self.config.rebalancing.pingpong_window_s, 3600.0)
        entries = sorted(snap.history.items())  # keys start with the start time in ms
        excess = len(entries) - self.runtime.history_entries_max
        doomed = []
        for key, h in entries:
            # An entry dated further ahead than the rules count (history.FUTURE_SKEW_S) is
            # not recent: it goes when the history is over its size, oldest keys first.
            recent = now - max(3600.0, self.config.rebalancing.pingpong_window_s) < h.started_at \
                <= now + FUTURE_SKEW_S
            if h.completed_at is None or recent:
                continue
            if h.started_at < keep_after or len(doomed) < excess:
                doomed.append(key)
            if len(doomed) >= batch_max:
                break
        if not doomed:
            return 0
        ops = [Delete(k) for k in doomed]
        return len(doomed) if self.executor.txn(token, [], ops) else 0

    def _forget(self) -> None:
        self._last_skipped = ()
        self._logged_alarms = set()
        self._term = None
        self._state = None
        self._views = ViewBuilder(self.config)

    def _on_leader_change(self, token: LeaderToken | None) -> None:
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> "LoadManager":
        self.election.start()
        for prefix in (keys.CLUSTER_PREFIX, keys.STORAGE_TOPICS_PREFIX):
            t = threading.Thread(target=self._watch_loop, args=(prefix,), daemon=True,
                                 name=f"dnb-lm-watch-{self.node_id}")
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._run, daemon=True, name=f"dnb-lm-{self.node_id}")
        t.start()
        self._threads.append(t)
        return self

    def stop(self, resign: bool = True) -> None:
        self._stop.set()
        self._wake.set()
        for w in list(self._watches):
            w.cancel()
        self.election.stop(resign=resign)
        for t in self._threads:
            t.join(10.0)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.last = report = self.step()
                self._step_failures.succeeded()
            except StorageError as e:
                self._step_failures.failed(e, "failed; retrying")
                report = StepReport(leader=self.election.is_leader())
            except Exception as e:  # noqa: BLE001 - the loop must outlive one bad step
                self._step_failures.failed(e, "failed", level=logging.ERROR, exc_info=True)
                report = StepReport(leader=self.election.is_leader())
            if self.on_step is not None:
                self.on_step(report)
            timeout = self.runtime.poll_interval_s
            if report.leader and self._next_wakeup is not None:
                timeout = min(timeout, max(0.0, self._next_wakeup - self.clock()))
            if report.leader and report.applied:
                timeout = 0.0  # act on the consequences at once
            self._wake.wait(timeout)
            self._wake.clear()
            if self.runtime.debounce_s:
                self._stop.wait(self.runtime.debounce_s)

    def _watch_loop(self, prefix: str) -> None:
        failures = self._watch_failures.setdefault(prefix, FailureLog(log, f"load manager: watch of {prefix}"))
        while not self._stop.is_set():
            try:
                watch = self.metadata.watch_prefix(prefix)
                self._watches.append(watch)
                if self._stop.is_set():
                    watch.cancel()
                for event in watch:
                    failures.succeeded()  # an event proves the watch works (opening it may not)
                    if self._interesting(event.key):
                        self._wake.set()
            except Exception as e:  # noqa: BLE001 - polling still covers a dead watch
                failures.failed(e, "failed; rewatching", level=logging.INFO)
                self._stop.wait(0.5)

    @staticmethod
    def _interesting(key: str) -> bool:
        if key.startswith(keys.STORAGE_TOPICS_PREFIX):
            return key.endswith("/owner") or key.endswith("/state")  # keys.owner_key, keys.state_key
        return not key.startswith(records.LOAD_PREFIX) and not key.startswith(records.HISTORY_PREFIX)


#: Keys of a load-manager config file that configure the runtime, not the decision core.
_RUNTIME_KEYS = {"leader_ttl_s": "leader_ttl_s", "leader_margin_s": "leader_margin_s",
                 "poll_interval_s": "poll_interval_s", "debounce_s": "debounce_s"}


def load_manager_settings(path: str | None) -> tuple[LoadManagerConfig, RuntimeConfig]:
    """Read a JSON file holding the seed's ``load_manager`` section (the section itself
    or ``{"load_manager": {...}}``) plus optional runtime keys; None: the defaults."""
    if path is None:
        return LoadManagerConfig(), RuntimeConfig()
    import json

    from tiered.cluster.errors import ConfigError

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("load_manager", f"cannot read {path}: {e}") from e
    if isinstance(data, dict) and isinstance(data.get("load_manager"), dict):
        data = data["load_manager"]
    if not isinstance(data, dict):
        raise ConfigError("load_manager", f"{path} must hold a JSON object")
    runtime = {name: data.pop(key) for key, name in _RUNTIME_KEYS.items() if key in data}
    return LoadManagerConfig.from_mapping(data), RuntimeConfig(**runtime)
