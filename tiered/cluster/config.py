"""The load manager's configuration: one frozen section, durations in seconds (``_s``).

The seed's keys and defaults (``load_report_interval_s`` 30, ``assignment_strategy``
balanced, ``rebalancing.{enabled false, aggressiveness balanced, check_interval_s 300,
max_moves_per_hour 10, cooldown_s 60, min_brokers_for_rebalance 2, min_topic_age_s 300,
blacklist_topics []}``) keep their names with the team's ``_s`` suffix; the seed's
``*_seconds`` spellings are accepted by :meth:`LoadManagerConfig.from_mapping` as aliases.

**Aggressiveness presets are applied in full.** A preset sets the CV threshold, the check
interval, the hourly move limit and the per-topic cooldown; a field left at ``None``
takes the preset's value and an explicit value overrides it (Danube's code applies only
the threshold and leaves the rest of its presets dead). Use :meth:`RebalancingConfig.effective`
to read the values in force.

Settings below "ours" are the safety rules the seed does not have (hysteresis, settle
delay, ping-pong window, minimum gain, failover grace and suspension, drain parallelism).
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from tiered.cluster.errors import ConfigError


class Strategy(str, enum.Enum):
    """How a broker's load score is computed (one score for placement, CV and moves)."""

    FAIR = "fair"
    BALANCED = "balanced"
    WEIGHTED_LOAD = "weighted_load"


class Aggressiveness(str, enum.Enum):
    CONSERVATIVE = "conservative"
    BALANCED = "balanced"
    AGGRESSIVE = "aggressive"


@dataclass(frozen=True, slots=True)
class Preset:
    cv_threshold: float
    check_interval_s: float
    max_moves_per_hour: int
    cooldown_s: float


#: The seed's table (threshold, interval, moves/hour) plus a cooldown per level.
PRESETS: Mapping[Aggressiveness, Preset] = {
    Aggressiveness.CONSERVATIVE: Preset(0.40, 600.0, 5, 120.0),
    Aggressiveness.BALANCED: Preset(0.30, 300.0, 10, 60.0),
    Aggressiveness.AGGRESSIVE: Preset(0.20, 120.0, 20, 30.0),
}


@dataclass(frozen=True, slots=True)
class EffectiveRebalancing:
    """The rebalancing values in force once the preset is applied."""

    cv_threshold: float
    check_interval_s: float
    max_moves_per_hour: int
    cooldown_s: float


@dataclass(frozen=True, slots=True)
class RebalancingConfig:
    # -- the seed's keys -------------------------------------------------------------
    enabled: bool = False
    aggressiveness: Aggressiveness = Aggressiveness.BALANCED
    #: None = from the preset (see module docstring).
    cv_threshold: float | None = None
    check_interval_s: float | None = None
    max_moves_per_hour: int | None = None
    cooldown_s: float | None = None
    min_brokers_for_rebalance: int = 2
    min_topic_age_s: float = 300.0
    #: fnmatch patterns (``*``, ``?``, ``[...]``) matched against ``/ns/topic``.
    blacklist_topics: tuple[str, ...] = ()
    # -- ours --------------------------------------------------------------------------
    #: Operator pause (``dnb lm pause``): checks still compute balance, never move.
    paused: bool = False
    #: Hysteresis: start after this many consecutive checks above the threshold ...
    hit_count: int = 2
    #: ... and keep moving until CV falls below ``stop_ratio * cv_threshold`` (half the
    #: trigger: an episode that starts ends in the seed's "excellent" band, so episodes
    #: are rare instead of hovering just under the trigger).
    stop_ratio: float = 0.5
    #: After a move completes, no automatic move until this long has passed and every
    #: broker it involved has reported since (its load data shows the move).
    settle_delay_s: float = 60.0
    #: A topic is never moved automatically back to a broker it left within this window.
    pingpong_window_s: float = 3600.0
    #: A move must lower the predicted CV by at least this fraction of the current CV.
    gain_ratio_min: float = 0.005
    #: Only move between brokers whose loads differ by at least this fraction of the mean:
    #: a smaller gap may be report noise, and a move across it may not help at all.
    pair_gap_min: float = 0.10
    #: Among the moves that help, take the lightest topic whose gain is at least this
    #: fraction of the best gain available (lightest first, but never a token move).
    gain_fraction_min: float = 0.5
    #: How many of the most loaded brokers are tried as the source in one check.
    sources_per_check_max: int = 3

    def effective(self) -> EffectiveRebalancing:
        preset = PRESETS[self.aggressiveness]
        return EffectiveRebalancing(
            cv_threshold=preset.cv_threshold if self.cv_threshold is None else self.cv_threshold,
            check_interval_s=preset.check_interval_s if self.check_interval_s is None else self.check_interval_s,
            max_moves_per_hour=preset.max_moves_per_hour if self.max_moves_per_hour is None else self.max_moves_per_hour,
            cooldown_s=preset.cooldown_s if self.cooldown_s is None else self.cooldown_s,
        )

    def __post_init__(self) -> None:
        _coerce_enum(self, "aggressiveness", Aggressiveness, "rebalancing.aggressiveness")
        if isinstance(self.blacklist_topics, (list, str)):
            object.__setattr__(self, "blacklist_topics", _patterns(self.blacklist_topics))
        for pattern in self.blacklist_topics:
            if not isinstance(pattern, str) or not pattern:
                raise ConfigError("rebalancing.blacklist_topics", f"pattern {pattern!r} is not a non-empty string")
        _check_bool(self, "enabled", "paused")
        _check_optional_positive(self, "cv_threshold", "check_interval_s")
        _check_optional_non_negative(self, "cooldown_s")
        if self.max_moves_per_hour is not None:
            _check_int(self, "max_moves_per_hour", minimum=0)
        _check_int(self, "min_brokers_for_rebalance", minimum=2)
        _check_int(self, "hit_count", minimum=1)
        _check_int(self, "sources_per_check_max", minimum=1)
        _check_non_negative(self, "min_topic_age_s", "settle_delay_s", "pingpong_window_s", "gain_ratio_min",
                            "pair_gap_min")
        _check_fraction(self, "stop_ratio", "gain_fraction_min")


@dataclass(frozen=True, slots=True)
class FailoverConfig:
    """When the topics of a broker whose registration vanished are reassigned."""

    #: Wait this long after the registration vanished before reassigning, when the
    #: leader's own session has been healthy for ``stable_after_s``: a broker that comes
    #: back within the grace recovers its own WAL and loses nothing.
    grace_s: float = 30.0
    #: The grace when the leader's session recovered recently (it may have missed events).
    grace_unstable_s: float = 180.0
    stable_after_s: float = 60.0
    #: More than this fraction of the known brokers vanishing within ``mass_window_s`` of
    #: each other looks like a metadata-store or network fault, not crashes: failover is
    #: suspended for ``mass_hold_s`` after the last of them vanished.
    mass_fraction: float = 0.5
    mass_window_s: float = 10.0
    mass_hold_s: float = 180.0
    #: Automatic rebalancing waits this many check intervals after a failover.
    rebalance_pause_checks: float = 2.0

    def __post_init__(self) -> None:
        _check_non_negative(self, "grace_s", "grace_unstable_s", "stable_after_s", "mass_window_s",
                            "mass_hold_s", "rebalance_pause_checks")
        _check_fraction(self, "mass_fraction")


@dataclass(frozen=True, slots=True)
class WeightedLoadConfig:
    #: A utilisation above this is a bottleneck and gets half of the weight.
    bottleneck_threshold: float = 0.7
    #: Weighted topic load one capacity unit can carry; None = relative to the cluster's
    #: most loaded broker (Danube's choice), which then takes no part in bottleneck
    #: detection because the busiest broker would always be at 100 %.
    topic_load_capacity: float | None = None

    def __post_init__(self) -> None:
        _check_fraction(self, "bottleneck_threshold")
        _check_optional_positive(self, "topic_load_capacity")


@dataclass(frozen=True, slots=True)
class LoadManagerConfig:
    # -- the seed's keys -------------------------------------------------------------
    load_report_interval_s: float = 30.0
    assignment_strategy: Strategy = Strategy.BALANCED
    rebalancing: RebalancingConfig = field(default_factory=RebalancingConfig)
    # -- ours --------------------------------------------------------------------------
    #: A report older than this many report intervals is stale: the broker gets no new
    #: topics and no rebalancing runs until it reports again.
    report_stale_intervals: float = 3.0
    #: Round-robin among brokers whose score is within this fraction of the minimum.
    placement_band_ratio: float = 0.10
    placement_band_abs: float = 0.01
    max_topics_per_broker: int | None = None
    #: Topics a draining broker hands over at the same time.
    drain_parallel: int = 4
    #: An assignment not loaded after this long is re-put; after ``assign_retries_max``
    #: re-puts the topic is given to another broker.
    assign_timeout_s: float = 45.0
    assign_retries_max: int = 3
    #: A release (seal) not done after this long raises an alarm (never a forced move).
    release_timeout_s: float = 150.0
    #: Connections cost CPU like this many bytes per second each (per-topic cost weight).
    connection_cost_bps: float = 1024.0
    #: EMA weight of the newest report (see :mod:`tiered.cluster.smoothing`).
    smoothing_alpha: float = 0.3
    #: Balanced's topic term: "relative" (a percentage of the average broker's, like CPU
    #: and memory) or "absolute" (the seed's literal sum; see :mod:`tiered.cluster.scoring`).
    balanced_topic_load: str = "relative"
    failover: FailoverConfig = field(default_factory=FailoverConfig)
    weighted_load: WeightedLoadConfig = field(default_factory=WeightedLoadConfig)

    def __post_init__(self) -> None:
        _coerce_enum(self, "assignment_strategy", Strategy, "assignment_strategy")
        _check_positive(self, "load_report_interval_s", "report_stale_intervals", "assign_timeout_s",
                        "release_timeout_s")
        _check_non_negative(self, "placement_band_ratio", "placement_band_abs", "connection_cost_bps")
        _check_int(self, "drain_parallel", minimum=1)
        _check_int(self, "assign_retries_max", minimum=0)
        if self.max_topics_per_broker is not None:
            _check_int(self, "max_topics_per_broker", minimum=1)
        if self.balanced_topic_load not in ("relative", "absolute"):
            raise ConfigError("balanced_topic_load", f"must be relative or absolute, got {self.balanced_topic_load!r}")
        if not 0.0 < self.smoothing_alpha <= 1.0:
            raise ConfigError("smoothing_alpha", f"must be in (0, 1], got {self.smoothing_alpha!r}")
        for name, kind in (("rebalancing", RebalancingConfig), ("failover", FailoverConfig),
                           ("weighted_load", WeightedLoadConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(name, f"expected a {kind.__name__}")

    @property
    def report_stale_after_s(self) -> float:
        return self.report_stale_intervals * self.load_report_interval_s

    def with_rebalancing(self, **changes: Any) -> "LoadManagerConfig":
        return replace(self, rebalancing=replace(self.rebalancing, **changes))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "LoadManagerConfig":
        """Build from a parsed YAML/JSON section (the seed's ``load_manager:`` block).

        Unknown keys are refused (a typo must not silently keep a default)."""
        if not isinstance(data, Mapping):
            raise ConfigError("load_manager", f"expected a mapping, got {type(data).__name__}")
        top = _renamed(data, "load_manager")
        sections = {"rebalancing": RebalancingConfig, "failover": FailoverConfig,
                    "weighted_load": WeightedLoadConfig}
        kwargs: dict[str, Any] = {}
        for key, value in top.items():
            if key in sections:
                if not isinstance(value, Mapping):
                    raise ConfigError(key, f"expected a mapping, got {type(value).__name__}")
                kwargs[key] = _build(sections[key], _renamed(value, key), key)
            else:
                kwargs[key] = value
        return _build(cls, kwargs, "load_manager")


# -- helpers ---------------------------------------------------------------------------

#: The seed's spellings, accepted on input.
_ALIASES = {
    "load_report_interval_seconds": "load_report_interval_s",
    "check_interval_seconds": "check_interval_s",
    "cooldown_seconds": "cooldown_s",
    "min_topic_age_seconds": "min_topic_age_s",
}


def _renamed(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = _ALIASES.get(key, key)
        if name in out:
            raise ConfigError(f"{where}.{name}", "given twice (once under its seed alias)")
        out[name] = value
    return out


def _build(kind: type, kwargs: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", f"unknown setting (known: {', '.join(sorted(known))})")
    try:
        return kind(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(where, str(e)) from e


def _patterns(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ConfigError("rebalancing.blacklist_topics", "expected a list of patterns, got one string")
    return tuple(value)


def _coerce_enum(obj: Any, name: str, kind: type[enum.Enum], setting: str) -> None:
    value = getattr(obj, name)
    if isinstance(value, kind):
        return
    try:
        object.__setattr__(obj, name, kind(value))
    except ValueError as e:
        choices = ", ".join(m.value for m in kind)  # type: ignore[attr-defined]
        raise ConfigError(setting, f"{value!r} is not one of {choices}") from e


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _check_positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not _is_number(value) or value <= 0:
            raise ConfigError(name, f"must be a number > 0, got {value!r}")


def _check_non_negative(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not _is_number(value) or value < 0:
            raise ConfigError(name, f"must be a number >= 0, got {value!r}")


def _check_optional_positive(obj: Any, *names: str) -> None:
    for name in names:
        if getattr(obj, name) is not None:
            _check_positive(obj, name)


def _check_optional_non_negative(obj: Any, *names: str) -> None:
    for name in names:
        if getattr(obj, name) is not None:
            _check_non_negative(obj, name)


def _check_fraction(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not _is_number(value) or not 0.0 <= value <= 1.0:
            raise ConfigError(name, f"must be a number in [0, 1], got {value!r}")


def _check_int(obj: Any, name: str, minimum: int) -> None:
    value = getattr(obj, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(name, f"must be an integer >= {minimum}, got {value!r}")


def _check_bool(obj: Any, *names: str) -> None:
    for name in names:
        if not isinstance(getattr(obj, name), bool):
            raise ConfigError(name, f"must be true or false, got {getattr(obj, name)!r}")
