"""The load manager: where topics live, when they move, and what happens when a broker
is drained or dies.

This package holds the **decision core**, a pure function shared by production and the
simulator (``bench/bench_load_manager.py``)::

    decision = decide(view, config, state, now)   # → actions, new state, balance, skips
    state = decision.state                          # pass it back next time

* ``config.py`` — :class:`LoadManagerConfig` (the seed's keys, presets, our safety rules).
* ``view.py`` — the input snapshot (:class:`ClusterView`) and :class:`CoreState`.
* ``actions.py`` — the answer (:class:`Decision` and its actions).
* ``scoring.py`` — Fair / Balanced / WeightedLoad and the one score model.
* ``placement.py``, ``rebalance.py``, ``failover.py``, ``drain.py`` — the rules.
* ``smoothing.py`` — EMA of load reports; ``metrics.py`` — the seed's metrics.

The runtime that elects a leader, builds views from the metadata store and carries
actions out as fenced transactions is described in ``docs/LOAD_MANAGER.md``.
"""
from tiered.cluster.actions import (
    Action,
    Alarm,
    Assign,
    BalanceStats,
    CompleteTransfer,
    Decision,
    DropMarker,
    MarkDrained,
    Reassign,
    RejectRequest,
    RetryAssign,
    Transfer,
)
from tiered.cluster.config import (
    PRESETS,
    Aggressiveness,
    FailoverConfig,
    LoadManagerConfig,
    RebalancingConfig,
    Strategy,
    WeightedLoadConfig,
)
from tiered.cluster.decide import decide, plan_rebalance
from tiered.cluster.errors import ClusterError, ConfigError, InvalidView
from tiered.cluster.view import (
    BrokerCapacity,
    BrokerInfo,
    BrokerMode,
    ClusterView,
    CoreState,
    LeaderHealth,
    LoadReport,
    MoveKind,
    MoveRecord,
    MoveRequest,
    Placement,
    PlacementState,
    TopicLoad,
    UnassignedMarker,
)

__all__ = [
    "PRESETS", "Action", "Aggressiveness", "Alarm", "Assign", "BalanceStats", "BrokerCapacity", "BrokerInfo",
    "BrokerMode", "ClusterError", "ClusterView", "CompleteTransfer", "ConfigError", "CoreState", "Decision",
    "DropMarker", "FailoverConfig", "InvalidView", "LeaderHealth", "LoadManagerConfig", "LoadReport", "MarkDrained",
    "MoveKind", "MoveRecord", "MoveRequest", "Placement", "PlacementState", "Reassign", "RebalancingConfig",
    "RejectRequest", "RetryAssign", "Strategy", "TopicLoad", "Transfer", "UnassignedMarker", "WeightedLoadConfig",
    "decide", "plan_rebalance",
]
