"""The working state of one decision: the model, the actions so far, and helpers the
rules share (choosing a broker, move ids, wake-ups). Lives only inside one
:func:`tiered.cluster.decide` call."""
from __future__ import annotations

from dataclasses import replace

from tiered.cluster.actions import (
    Action,
    Alarm,
    AnswerRebalance,
    Assign,
    DropMarker,
    MarkDrained,
    RejectRequest,
    RetryAssign,
)
from tiered.cluster.config import LoadManagerConfig
from tiered.cluster.history import HistoryIndex
from tiered.cluster.placement import band, round_robin
from tiered.cluster.scoring import ScoreModel
from tiered.cluster.view import BrokerMode, ClusterView, CoreState, Placement, PlacementState


class Context:
    def __init__(self, view: ClusterView, config: LoadManagerConfig, state: CoreState, now: float) -> None:
        self.view = view
        self.config = config
        self.now = now
        self.state = state
        self.topics = sorted(view.placements)
        self.model = ScoreModel(view, config, now, self.topics)
        self.history = HistoryIndex(view.history, now)
        self.actions: list[Action] = []
        self.alarms: list[Alarm] = []
        self.skipped: list[str] = []
        self.touched: set[str] = set()
        self.wakeups: list[float] = []
        self.checked = False
        self.balance = None
        #: Placements naming each broker as owner, assignee or source (by topic).
        self.by_broker: dict[str, list[Placement]] = {}
        #: Topics each broker owns (state ``owned``), by topic.
        self.owned: dict[str, list[str]] = {}
        #: Placements not simply owned (assigning, releasing, free), by topic.
        self.unsettled: list[Placement] = []
        owned_state = PlacementState.OWNED
        for topic in self.topics:
            p = view.placements[topic]
            if p.state is not owned_state:
                self.unsettled.append(p)
            if p.broker is not None:
                self.by_broker.setdefault(p.broker, []).append(p)
                if p.state is owned_state:
                    self.owned.setdefault(p.broker, []).append(topic)

    # -- brokers ---------------------------------------------------------------------
    def is_active(self, broker: str | None) -> bool:
        info = self.view.brokers.get(broker) if broker is not None else None
        return info is not None and info.registered and info.mode is BrokerMode.ACTIVE

    def choose(self, topic: str, exclude: set[str | None]) -> str | None:
        """Pick a broker for ``topic`` (round-robin in the band) and count it there."""
        candidates = self.model.eligible_targets(exclude)
        members = band(self.model, candidates, self.config.placement_band_ratio, self.config.placement_band_abs)
        broker = round_robin(members, self.state.rr_last)
        if broker is not None:
            self.model.place(topic, broker)
            self.state = replace(self.state, rr_last=broker)
        return broker

    # -- bookkeeping -----------------------------------------------------------------
    def move_id(self) -> str:
        """Unique within this leader's run; the runtime prefixes its term."""
        seq = self.state.seq + 1
        self.state = replace(self.state, seq=seq)
        return f"{int(self.now * 1000)}-{seq}"

    def act(self, action: Action, topic: str | None = None) -> None:
        self.actions.append(action)
        if topic is not None:
            self.touched.add(topic)

    def alarm(self, kind: str, subject: str, detail: str) -> None:
        self.alarms.append(Alarm(kind, subject, detail))

    def wake_at(self, when: float) -> None:
        self.wakeups.append(when)

    def moves_in_flight(self) -> bool:
        """A move (not a new topic's first assignment) is under way, in the view or
        started by this decision."""
        for p in self.unsettled:
            if p.state is PlacementState.RELEASING or (p.state is PlacementState.ASSIGNING and p.kind is not None):
                return True
        return any(not isinstance(a, _PASSIVE) for a in self.actions)


#: Actions that start no move.
_PASSIVE = (AnswerRebalance, Assign, DropMarker, MarkDrained, RejectRequest, RetryAssign)
