"""What the decision core answers: actions on placement records, and why it did nothing.

Every action changes where a topic *should* live; the runtime carries each out as one
fenced compare-and-swap on the topic's placement record (plus the assignment keys and
marker in the same transaction). No action deletes data, forces an ownership takeover or
touches ``/storage/*`` or cursors: unloading is the owner's seal, loading is the
target's restore, and both keep a topic's offsets contiguous whatever the core decides.
"""
from __future__ import annotations

from dataclasses import dataclass

from tiered.cluster.view import CoreState, MoveKind


@dataclass(frozen=True, slots=True)
class Assign:
    """Give an unplaced topic (a marker, no live placement) to ``broker``."""

    topic: str
    broker: str
    reason: str


@dataclass(frozen=True, slots=True)
class Transfer:
    """Start a move (M1): placement ``owned by from_broker`` → ``releasing``, with the
    target chosen now. The target is assigned only after the source has released."""

    topic: str
    from_broker: str
    to_broker: str
    kind: MoveKind
    move_id: str
    #: The seed's topic load score (history's ``estimated_load``).
    estimated_load: float
    #: The imbalance the move is for, before and as predicted after (auto moves).
    cv_before: float | None = None
    cv_after: float | None = None
    request_id: str | None = None
    #: The operator's rebalance request this move answers (answered in the same write).
    rebalance_request: str | None = None


@dataclass(frozen=True, slots=True)
class CompleteTransfer:
    """M3: the source released; assign ``to_broker`` (the planned target, or another if
    the planned one is no longer eligible: ``retargeted``)."""

    topic: str
    from_broker: str
    to_broker: str
    move_id: str | None
    retargeted: bool


@dataclass(frozen=True, slots=True)
class Reassign:
    """Move the assignment of a topic whose broker is gone (``failover``) or never
    loaded it in time (``retarget``) to ``to_broker``. For failover the runtime's txn
    also requires the old broker's registration to be absent."""

    topic: str
    from_broker: str
    to_broker: str
    reason: str
    move_id: str


@dataclass(frozen=True, slots=True)
class RetryAssign:
    """Re-put a stuck assignment so the broker's watcher retries its load."""

    topic: str
    broker: str
    attempt: int


@dataclass(frozen=True, slots=True)
class DropMarker:
    """Delete an unassigned marker for a topic that is already placed (a duplicate)."""

    topic: str
    reason: str


@dataclass(frozen=True, slots=True)
class MarkDrained:
    """No placement names the draining broker any more."""

    broker: str


@dataclass(frozen=True, slots=True)
class RejectRequest:
    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class AnswerRebalance:
    """Answer an operator's rebalance request with why its cycle moved nothing."""

    request_id: str
    outcome: str


Action = (Assign | Transfer | CompleteTransfer | Reassign | RetryAssign | DropMarker | MarkDrained | RejectRequest
          | AnswerRebalance)


@dataclass(frozen=True, slots=True)
class Alarm:
    """Something an operator should look at; the core keeps deciding around it."""

    kind: str
    subject: str
    detail: str


@dataclass(frozen=True, slots=True)
class BalanceStats:
    """Balance of the brokers that take part in rebalancing (registered, active, fresh)."""

    brokers: int
    mean: float
    std_dev: float
    cv: float
    min_load: float
    max_load: float
    #: The seed's classification: load > mean + σ; load < mean − σ and < mean / 2.
    overloaded: tuple[str, ...]
    underloaded: tuple[str, ...]
    #: CV of estimated CPU utilisation, when the strategy weighs resources and a check ran.
    cpu_cv: float | None = None
    #: How far the hottest broker's CPU is above the mean, as a fraction of the mean (same
    #: condition); rebalancing starts when this or a CV is above the threshold.
    cpu_hot: float | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    actions: tuple[Action, ...]
    state: CoreState
    #: (broker, score) of every broker with a score, least loaded first.
    rankings: tuple[tuple[str, float], ...]
    balance: BalanceStats | None
    #: Why the rebalancing check (if one ran) moved nothing: NotDue, Disabled, Paused,
    #: WarmingUp, TooFewBrokers, Stale, Failover, InFlight, Settling, HitCount, Balanced,
    #: RateLimit, NoCandidate.
    skipped: tuple[str, ...]
    alarms: tuple[Alarm, ...]
    #: Whether a rebalancing check ran in this call.
    checked: bool
    #: When to call again at the latest if nothing else happens (None: only on events).
    next_wakeup_at: float | None
