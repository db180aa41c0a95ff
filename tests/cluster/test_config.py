"""Configuration: the seed's keys and defaults, presets applied in full, typed errors."""
from __future__ import annotations

import pytest

from tiered.cluster import PRESETS, Aggressiveness, ConfigError, LoadManagerConfig, RebalancingConfig, Strategy


def test_seed_defaults() -> None:
    cfg = LoadManagerConfig()
    assert cfg.load_report_interval_s == 30.0
    assert cfg.assignment_strategy is Strategy.BALANCED
    r = cfg.rebalancing
    assert (r.enabled, r.aggressiveness, r.min_brokers_for_rebalance, r.min_topic_age_s, r.blacklist_topics) == (
        False, Aggressiveness.BALANCED, 2, 300.0, ())
    eff = r.effective()
    assert (eff.check_interval_s, eff.max_moves_per_hour, eff.cooldown_s, eff.cv_threshold) == (300.0, 10, 60.0, 0.30)


@pytest.mark.parametrize("level, expected", [
    ("conservative", (0.40, 600.0, 5, 120.0)),
    ("balanced", (0.30, 300.0, 10, 60.0)),
    ("aggressive", (0.20, 120.0, 20, 30.0)),
])
def test_presets_apply_in_full(level: str, expected: tuple) -> None:
    eff = RebalancingConfig(aggressiveness=level).effective()
    assert (eff.cv_threshold, eff.check_interval_s, eff.max_moves_per_hour, eff.cooldown_s) == expected
    assert PRESETS[Aggressiveness(level)].max_moves_per_hour == expected[2]


def test_explicit_values_override_the_preset() -> None:
    eff = RebalancingConfig(aggressiveness="aggressive", max_moves_per_hour=3, cv_threshold=0.5).effective()
    assert (eff.cv_threshold, eff.check_interval_s, eff.max_moves_per_hour, eff.cooldown_s) == (0.5, 120.0, 3, 30.0)


def test_from_mapping_takes_the_seed_block_with_its_spellings() -> None:
    cfg = LoadManagerConfig.from_mapping({
        "load_report_interval_seconds": 15,
        "assignment_strategy": "weighted_load",
        "rebalancing": {"enabled": True, "aggressiveness": "conservative", "check_interval_seconds": 900,
                        "max_moves_per_hour": 4, "cooldown_seconds": 10, "min_brokers_for_rebalance": 3,
                        "min_topic_age_seconds": 60, "blacklist_topics": ["/system/*", "/analytics/logs"]},
    })
    assert cfg.load_report_interval_s == 15 and cfg.assignment_strategy is Strategy.WEIGHTED_LOAD
    r = cfg.rebalancing
    assert r.blacklist_topics == ("/system/*", "/analytics/logs") and r.min_topic_age_s == 60
    eff = r.effective()
    assert (eff.cv_threshold, eff.check_interval_s, eff.max_moves_per_hour, eff.cooldown_s) == (0.40, 900, 4, 10)


@pytest.mark.parametrize("data, setting", [
    ({"assignment_strategy": "random"}, "assignment_strategy"),
    ({"rebalancing": {"aggressiveness": "wild"}}, "rebalancing.aggressiveness"),
    ({"rebalancing": {"check_interval_s": 0}}, "check_interval_s"),
    ({"rebalancing": {"max_moves_per_hour": -1}}, "max_moves_per_hour"),
    ({"rebalancing": {"min_brokers_for_rebalance": 1}}, "min_brokers_for_rebalance"),
    ({"rebalancing": {"blacklist_topics": "/system/*"}}, "rebalancing.blacklist_topics"),
    ({"rebalancing": {"stop_ratio": 1.5}}, "stop_ratio"),
    ({"rebalancing": {"cooldown_s": 5, "cooldown_seconds": 6}}, "rebalancing.cooldown_s"),
    ({"rebalancing": {"enabled": "yes"}}, "enabled"),
    ({"load_report_interval_s": float("nan")}, "load_report_interval_s"),
    ({"drain_parallel": 0}, "drain_parallel"),
    ({"smoothing_alpha": 0}, "smoothing_alpha"),
    ({"check_interval_s": 5}, "load_manager.check_interval_s"),
    ({"rebalancing": []}, "rebalancing"),
])
def test_bad_settings_are_typed_errors_naming_the_setting(data: dict, setting: str) -> None:
    with pytest.raises(ConfigError) as e:
        LoadManagerConfig.from_mapping(data)
    assert e.value.setting == setting
    assert isinstance(e.value, ValueError)


def test_config_is_frozen() -> None:
    cfg = LoadManagerConfig()
    with pytest.raises(AttributeError):
        cfg.drain_parallel = 9  # type: ignore[misc]
