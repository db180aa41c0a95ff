"""Automatic rebalancing: at most one move per check, and only a move that helps.

A check runs every ``check_interval_s`` (from the aggressiveness preset) and goes
through these gates, each a skip reason when it stops the check:

1. ``Disabled`` / ``Paused``; ``WarmingUp`` (a new leader waits two report intervals);
   ``Stale`` (an active broker's report is missing or old); ``TooFewBrokers``;
   ``Failover`` (a broker's topics await failover, or one happened within
   ``rebalance_pause_checks`` intervals); ``InFlight`` (a move is under way);
   ``Settling`` (the last move completed less than ``max(settle_delay_s, cooldown_s)``
   ago, or a broker it involved has not reported since).
2. Hysteresis on the CV of the broker scores: ``HitCount`` until ``hit_count``
   consecutive checks see CV above the threshold; then moves continue until CV falls
   below ``stop_ratio × threshold`` (``Balanced`` once it does).
3. ``RateLimit``: the persisted history holds ``max_moves_per_hour`` automatic or
   manual moves started in the last hour.
4. A move from one of the most loaded brokers (above the mean) to the least loaded
   eligible broker. Candidates are the source's owned topics that are not blacklisted,
   at least ``min_topic_age_s`` old, not moved within ``cooldown_s`` and did not leave
   the target within ``pingpong_window_s``. A candidate qualifies only if moving it
   lowers the predicted CV by at least ``gain_ratio_min`` of the CV and leaves the target
   no higher than the source; of those, the lightest (seed's topic score) whose gain is
   at least ``gain_fraction_min`` of the best gain is moved. Else ``NoCandidate``.

Why this cannot ping-pong on a steady load: every move strictly lowers Σ(score − mean)²
of the scores it was computed on, and a topic never returns to a broker it left within
the window.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from tiered.cluster.actions import Transfer
from tiered.cluster.config import EffectiveRebalancing, RebalancingConfig
from tiered.cluster.context import Context
from tiered.cluster.history import HistoryIndex
from tiered.cluster.scoring import ScoreModel, balance_stats, cv_of, topic_load_score
from tiered.cluster.view import MoveKind


@dataclass(frozen=True, slots=True)
class Candidate:
    topic: str
    source: str
    target: str
    gain: float
    cv_after: float
    lightness: float


def blacklist_matcher(patterns: tuple[str, ...]):
    """A predicate for the seed's wildcard patterns (fnmatch, case-sensitive)."""
    if not patterns:
        return lambda topic: False
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))
    return lambda topic: regex.match(topic) is not None


def check(ctx: Context) -> None:
    cfg = ctx.config.rebalancing
    eff = cfg.effective()
    state = ctx.state
    if not cfg.enabled:
        return
    if state.last_check_at is not None and ctx.now - state.last_check_at < eff.check_interval_s:
        ctx.wake_at(state.last_check_at + eff.check_interval_s)
        return
    ctx.checked = True
    ctx.state = replace(state, last_check_at=ctx.now)
    ctx.wake_at(ctx.now + eff.check_interval_s)
    reason = _gate(ctx, cfg, eff)
    if reason is not None:
        ctx.skipped.append(reason)
        return
    loads = ctx.model.balance_loads()
    stats = balance_stats(loads)
    ctx.balance = stats
    if not _hysteresis(ctx, cfg, eff, stats.cv):
        return
    if ctx.history.moves_in_last_hour(ctx.now) >= eff.max_moves_per_hour:
        ctx.skipped.append("RateLimit")
        return
    move = select_move(ctx.model, ctx.view, ctx.owned, ctx.history, cfg, eff, ctx.now, exclude=ctx.touched)
    if move is None:
        ctx.skipped.append("NoCandidate")
        return
    ctx.model.place(move.topic, move.target)
    ctx.act(Transfer(move.topic, move.source, move.target, MoveKind.AUTO, ctx.move_id(),
                     topic_load_score(ctx.model.load_of(move.topic)), stats.cv, move.cv_after), move.topic)


def _gate(ctx: Context, cfg: RebalancingConfig, eff: EffectiveRebalancing) -> str | None:
    model, view, now = ctx.model, ctx.view, ctx.now
    if cfg.paused:
        return "Paused"
    if ctx.state.started_at is not None and now - ctx.state.started_at < 2 * ctx.config.load_report_interval_s:
        return "WarmingUp"
    if any(b not in model.fresh for b in model.active):
        return "Stale"
    if len(model.balance_set) < cfg.min_brokers_for_rebalance:
        return "TooFewBrokers"
    if _failover_pending(ctx, eff):
        return "Failover"
    if ctx.moves_in_flight():
        return "InFlight"
    settle_s = max(cfg.settle_delay_s, eff.cooldown_s)
    last = ctx.history.last_completed((MoveKind.AUTO, MoveKind.MANUAL, MoveKind.DRAIN))
    if last is not None:
        if now - last.completed_at < settle_s:
            return "Settling"
        for broker in (last.from_broker, last.to_broker):
            info = view.brokers.get(broker) if broker is not None else None
            if info is not None and info.registered and (info.report is None or info.report.ts < last.completed_at):
                return "Settling"
    return None


def _failover_pending(ctx: Context, eff: EffectiveRebalancing) -> bool:
    for broker, info in ctx.view.brokers.items():
        if not info.registered and ctx.by_broker.get(broker):
            return True
    last = ctx.history.last_failover_at()
    pause_s = ctx.config.failover.rebalance_pause_checks * eff.check_interval_s
    return last is not None and ctx.now - last < pause_s


def _hysteresis(ctx: Context, cfg: RebalancingConfig, eff: EffectiveRebalancing, cv: float) -> bool:
    """Update hit count / active flag; True when this check may move."""
    state = ctx.state
    if state.rebalancing:
        if cv < cfg.stop_ratio * eff.cv_threshold:
            ctx.state = replace(state, rebalancing=False, hits=0)
            ctx.skipped.append("Balanced")
            return False
        return True
    hits = state.hits + 1 if cv > eff.cv_threshold else 0
    if hits >= cfg.hit_count:
        ctx.state = replace(state, rebalancing=True, hits=hits)
        return True
    ctx.state = replace(state, hits=hits)
    ctx.skipped.append("HitCount" if hits else "Balanced")
    return False


def select_move(model: ScoreModel, view, owned: Mapping[str, list[str]], history: HistoryIndex,
                cfg: RebalancingConfig, eff: EffectiveRebalancing, now: float,
                exclude: Set[str] = frozenset()) -> Candidate | None:
    """The move the rules allow and prefer, computed on ``model`` (not applied).
    ``owned`` lists each broker's owned topics (see :func:`owned_by_broker`)."""
    loads = model.balance_loads()
    n = len(loads)
    if n < 2:
        return None
    total = sum(loads.values())
    total_sq = sum(v * v for v in loads.values())
    cv = cv_of(n, total, total_sq)
    mean = total / n
    sources = sorted((b for b in loads if loads[b] > mean), key=lambda b: (-loads[b], b))
    blacklisted = blacklist_matcher(cfg.blacklist_topics)
    for source in sources[:cfg.sources_per_check_max]:
        targets = [b for b in model.eligible_targets({source}) if b in loads]
        if not targets:
            continue
        target = min(targets, key=lambda b: (loads[b], b))
        if loads[target] >= loads[source]:
            continue
        candidates = []
        for topic in owned.get(source, ()):
            if topic in exclude or blacklisted(topic):
                continue
            p = view.placements[topic]
            if now - p.created_at < cfg.min_topic_age_s:
                continue
            moved_at = history.last_moved_at(topic)
            if moved_at is not None and now - moved_at < eff.cooldown_s:
                continue
            if history.left_since(topic, target, now - cfg.pingpong_window_s):
                continue
            c = _evaluate(model, topic, source, target, loads, n, total, total_sq, cv, cfg)
            if c is not None:
                candidates.append(c)
        if candidates:
            best = max(c.gain for c in candidates)
            good = [c for c in candidates if c.gain >= cfg.gain_fraction_min * best]
            return min(good, key=lambda c: (c.lightness, c.topic))
    return None


def _evaluate(model: ScoreModel, topic: str, source: str, target: str, loads, n: int, total: float,
              total_sq: float, cv: float, cfg: RebalancingConfig) -> Candidate | None:
    out = model.contribution(topic, source)
    into = model.contribution(topic, target)
    new_source, new_target = loads[source] - out, loads[target] + into
    if new_target > new_source:
        return None  # the target would become the hotter of the two: the next move undoes it
    new_total = total - out + into
    new_sq = total_sq - loads[source] ** 2 - loads[target] ** 2 + new_source ** 2 + new_target ** 2
    cv_after = cv_of(n, new_total, new_sq)
    gain = cv - cv_after
    if gain <= 0 or gain < cfg.gain_ratio_min * cv:
        return None
    return Candidate(topic, source, target, gain, cv_after, topic_load_score(model.load_of(topic)))


