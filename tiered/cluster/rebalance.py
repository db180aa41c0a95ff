"""Automatic rebalancing: at most one move per check, and only a move that helps.

A check runs every ``check_interval_s`` (from the aggressiveness preset) and goes
through these gates, each a skip reason when it stops the check:

1. ``Disabled`` / ``Paused``; ``WarmingUp`` (a new leader waits two report intervals);
   ``Stale`` (an active broker's report is missing or old); ``TooFewBrokers``;
   ``Failover`` (a broker's topics await failover, or one happened within
   ``rebalance_pause_checks`` intervals); ``InFlight`` (a move is under way);
   ``Settling`` (the last move completed less than ``max(settle_delay_s, cooldown_s)``
   ago, or a broker it involved has not reported since).
2. Hysteresis: ``HitCount`` until ``hit_count`` consecutive checks see the trigger
   above the threshold; then moves continue until it falls below ``stop_ratio ×
   threshold`` (``Balanced`` once it does). The trigger is the CV of the broker scores
   (the seed's rule) or, for the strategies that weigh resources, the CV of CPU
   utilisation or how far the hottest broker's CPU is above the mean (as a fraction of
   the mean), whichever is largest. The last one is ours: the CV dilutes a single hot
   broker as the cluster grows (one broker x above the mean and the others equal give
   CV = x/√(N − 1)), so with 20 brokers one at 100 % CPU among others at 50 % is a CV of
   0.21, "balanced" for the 0.30 preset; and on three brokers at 41, 70 and 47 % (CV
   0.24) the seed waits while the hot one climbs. Both name the same threshold; with two
   brokers they are the same number.
3. ``RateLimit``: the persisted history holds ``max_moves_per_hour`` automatic or
   manual moves started in the last hour.
4. A move from one of the most loaded brokers (above the mean) to the least loaded
   eligible broker, by the quantity whose CV is the imbalance (the larger of the
   scores' and CPU's CV), then by the other one. Candidates are the source's owned
   topics that are not blacklisted, at least ``min_topic_age_s`` old, not moved within
   ``cooldown_s`` and did not leave the target within ``pingpong_window_s``. A candidate
   qualifies only if moving it passes :class:`_Rules`: it lowers the imbalance by at
   least ``gain_ratio_min`` of it; the scores' CV stays within what it is or the stop
   band; CPU's CV falls, also if the estimates of source and target were wrong by
   report noise; the target ends at least ``pair_gap_min`` of the mean below where the
   source was (it may end above the source). Of those, the lightest (seed's topic score)
   whose gain is at least ``gain_fraction_min`` of the best gain is moved. Source and
   target must differ by ``pair_gap_min`` of the mean (a smaller gap may be noise).
   Else ``NoCandidate``.

**An operator's request** (``dnb cluster rebalance``, :attr:`ClusterView.rebalance_request`)
runs one check now, whatever the schedule and whether automatic rebalancing is enabled,
through the same gates, limits and candidate rules. Only the hit count is waived (the
request is the confirmation): the check moves if the trigger is above the threshold,
or above ``stop_ratio × threshold`` while a rebalancing is under way. The move carries
the request (answered in the same write); a check that moves nothing answers it with
its skip reason (:class:`~tiered.cluster.actions.AnswerRebalance`).

Why this cannot ping-pong on a steady load: every move strictly lowers the imbalance,
max(CV of the scores, CV of CPU), computed on the same model (the score's CV may rise
only while it stays below the imbalance), and a topic never returns to a broker it left
within the window.
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from tiered.cluster.actions import AnswerRebalance, Transfer
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
    request = ctx.view.rebalance_request
    if not cfg.enabled and request is None:
        return
    if request is None and state.last_check_at is not None and ctx.now - state.last_check_at < eff.check_interval_s:
        ctx.wake_at(state.last_check_at + eff.check_interval_s)
        return
    ctx.checked = True
    ctx.state = replace(state, last_check_at=ctx.now)
    ctx.wake_at(ctx.now + eff.check_interval_s)
    reason = _cycle(ctx, cfg, eff, request)
    if reason is not None:
        ctx.skipped.append(reason)
        if request is not None:
            ctx.act(AnswerRebalance(request, reason))


def _cycle(ctx: Context, cfg: RebalancingConfig, eff: EffectiveRebalancing, request: str | None) -> str | None:
    """One check: a move (None) or why none (a skip reason)."""
    reason = _gate(ctx, cfg, eff)
    if reason is not None:
        return reason
    stats = balance_stats(ctx.model.balance_loads())
    spreads = Spreads(ctx.model)
    cpu = spreads.cpu
    if cpu is not None:
        stats = replace(stats, cpu_cv=cpu.cv, cpu_hot=cpu.hot)
    ctx.balance = stats
    reason = _hysteresis(ctx, cfg, eff, spreads.trigger, requested=request is not None)
    if reason is not None:
        return reason
    if ctx.history.moves_in_last_hour(ctx.now) >= eff.max_moves_per_hour:
        return "RateLimit"
    move = select_move(ctx.model, ctx.view, ctx.owned, ctx.history, cfg, eff, ctx.now, exclude=ctx.touched)
    if move is None:
        return "NoCandidate"
    ctx.model.place(move.topic, move.target)
    ctx.act(Transfer(move.topic, move.source, move.target, MoveKind.AUTO, ctx.move_id(),
                     topic_load_score(ctx.model.load_of(move.topic)), spreads.imbalance, move.cv_after,
                     rebalance_request=request), move.topic)
    return None


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


def _hysteresis(ctx: Context, cfg: RebalancingConfig, eff: EffectiveRebalancing, cv: float,
                requested: bool = False) -> str | None:
    """Update hit count / active flag; None when this check may move, else why not.
    ``requested`` (an operator's request) counts as the last hit needed."""
    state = ctx.state
    if state.rebalancing:
        if cv < cfg.stop_ratio * eff.cv_threshold:
            ctx.state = replace(state, rebalancing=False, hits=0)
            return "Balanced"
        return None
    hits = state.hits + 1 if cv > eff.cv_threshold else 0
    if hits >= cfg.hit_count or (requested and hits):
        ctx.state = replace(state, rebalancing=True, hits=hits)
        return None
    ctx.state = replace(state, hits=hits)
    return "HitCount" if hits else "Balanced"


class Spread:
    """One per-broker quantity over the balance set: its CV, and its CV after a move."""

    def __init__(self, values: Mapping[str, float]) -> None:
        self.values = values
        self.n = len(values)
        self.total = sum(values.values())
        self.total_sq = sum(v * v for v in values.values())
        self.cv = cv_of(self.n, self.total, self.total_sq)
        mean = self.total / self.n if self.n else 0.0
        #: How far the hottest broker is above the mean, as a fraction of the mean.
        self.hot = max(values.values()) / mean - 1.0 if mean > 0 else 0.0

    def after(self, source: str, target: str, out: float, into: float) -> tuple[float, float, float]:
        """(CV, source value, target value) once ``out`` leaves source and ``into`` lands on target."""
        s, d = self.values[source], self.values[target]
        new_s, new_d = s - out, d + into
        new_sq = self.total_sq - s * s - d * d + new_s * new_s + new_d * new_d
        return cv_of(self.n, self.total - out + into, new_sq), new_s, new_d

    def lowers_cv_despite(self, source: str, target: str, out: float, into: float, error: float) -> bool:
        """Whether the move lowers the CV also when the source is ``error`` lower and the
        target ``error`` higher than estimated (both estimates wrong against the move)."""
        s, d = self.values[source], self.values[target]
        sq = self.total_sq - s * s - d * d
        s, d = s - error, d + error
        before = cv_of(self.n, self.total, sq + s * s + d * d)
        after = cv_of(self.n, self.total - out + into, sq + (s - out) ** 2 + (d + into) ** 2)
        return after < before


class Spreads:
    """The imbalance a check acts on: the CV of the strategy's scores and, for the
    strategies that weigh resources (balanced, weighted_load), the CV of CPU utilisation.

    The score mixes resources with topic counts and connections, which round-robin
    placement has usually equalised already: its CV can look balanced while one broker
    runs at twice another's CPU. So the imbalance is the larger of the two CVs, and a
    move must lower it. It may not buy score balance with CPU balance. It may buy CPU
    balance with score balance the score has to spare (its CV stays below the stop band
    or where it was): after a drain or a failover placed by the score, a big broker
    holding a few heavy topics has the lowest score (fewest topics per core) and the
    highest CPU, and a score that may not rise would keep every topic there."""

    def __init__(self, model: ScoreModel) -> None:
        self.score = Spread(model.balance_loads())
        cpu = Spread(model.balance_cpu()) if model.guards_cpu else None
        #: None also when no broker reports any CPU use: there is no spread to lower.
        self.cpu = cpu if cpu is not None and cpu.total > 0 else None
        self.imbalance = max(self.score.cv, self.cpu.cv) if self.cpu is not None else self.score.cv
        #: What the hysteresis compares with the threshold: the imbalance, or how far the
        #: hottest broker's CPU is above the mean if that is more (see the module docstring).
        self.trigger = max(self.imbalance, self.cpu.hot) if self.cpu is not None else self.imbalance
        #: The quantity that picks source and target: the one whose CV is the imbalance.
        self.driver = self.cpu if self.cpu is not None and self.cpu.cv > self.score.cv else self.score


def select_move(model: ScoreModel, view, owned: Mapping[str, list[str]], history: HistoryIndex,
                cfg: RebalancingConfig, eff: EffectiveRebalancing, now: float,
                exclude: Set[str] = frozenset()) -> Candidate | None:
    """The move the rules allow and prefer, computed on ``model`` (not applied).
    ``owned`` lists each broker's owned topics (see :class:`tiered.cluster.context.Context`)."""
    spreads = Spreads(model)
    if spreads.score.n < 2:
        return None
    rules = _Rules(model, spreads, cfg, eff)
    blacklisted = blacklist_matcher(cfg.blacklist_topics)
    for spread, source, target in _pairs(model, spreads, cfg):
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
            c = rules.evaluate(topic, source, target, spread)
            if c is not None:
                candidates.append(c)
        if candidates:
            best = max(c.gain for c in candidates)
            good = [c for c in candidates if c.gain >= cfg.gain_fraction_min * best]
            return min(good, key=lambda c: (c.lightness, c.topic))
    return None


def _pairs(model: ScoreModel, spreads: Spreads, cfg: RebalancingConfig):
    """(quantity, source, target): for the driver and then the other quantity, each of its
    ``sources_per_check_max`` most loaded brokers above the mean with that quantity's
    least loaded eligible broker, when they differ by ``pair_gap_min`` of the mean.

    The score and CPU may disagree about which broker is the coolest (a big broker with
    few heavy topics scores low on topic count and runs hot): when the score drives, the
    move that lowers it and also CPU may exist only between the brokers CPU names."""
    quantities = [spreads.driver]
    if spreads.cpu is not None:
        quantities.append(spreads.score if spreads.driver is spreads.cpu else spreads.cpu)
    seen = set()
    for spread in quantities:
        values = spread.values
        mean = spread.total / spread.n
        sources = sorted((b for b in values if values[b] > mean), key=lambda b: (-values[b], b))
        for source in sources[:cfg.sources_per_check_max]:
            targets = [b for b in model.eligible_targets({source}) if b in values]
            if not targets:
                continue
            target = min(targets, key=lambda b: (values[b], b))
            if values[source] - values[target] < cfg.pair_gap_min * mean or (source, target) in seen:
                continue
            seen.add((source, target))
            yield spread, source, target


class _Rules:
    """Whether one move qualifies, and its gain. A move must:

    * lower the imbalance (the larger of the score's and CPU's CV) by ``gain_ratio_min``
      of it;
    * leave the score's CV no higher than it is or than the stop band
      (``stop_ratio × threshold``), whichever is higher: while CPU is the imbalance, the
      score may give up a balance it has to spare, never become an imbalance of its own;
    * when the strategy weighs resources, lower CPU's CV, also if the source's and the
      target's CPU estimates were each ``pair_gap_min / 2`` of the mean wrong against the
      move. A move that does not clearly lower the spread of the resource the brokers
      use is futile: it costs the topic an unload and a load and changes nothing a
      broker feels (moving topics for their count alone, or between two brokers whose
      CPU differs by less than report noise);
    * leave the target at least ``pair_gap_min`` of the mean below where the source was,
      in the quantity that chose the pair and in CPU (else the move only shifts the
      hotspot, and noise may make it a worse one).
    """

    def __init__(self, model: ScoreModel, spreads: Spreads, cfg: RebalancingConfig,
                 eff: EffectiveRebalancing) -> None:
        self.model = model
        self.spreads = spreads
        self.cfg = cfg
        self.score_cap = max(spreads.score.cv, cfg.stop_ratio * eff.cv_threshold)

    def evaluate(self, topic: str, source: str, target: str, chosen_by: Spread) -> Candidate | None:
        model, spreads, cfg = self.model, self.spreads, self.cfg
        score_cv, _, score_d = spreads.score.after(
            source, target, model.contribution(topic, source), model.contribution(topic, target))
        if score_cv > self.score_cap:
            return None
        if chosen_by is spreads.score and not _below_source(spreads.score, source, score_d, cfg):
            return None
        after = score_cv
        cpu = spreads.cpu
        if cpu is not None:
            out, into = model.cpu_contribution(topic, source), model.cpu_contribution(topic, target)
            cpu_cv, _, cpu_d = cpu.after(source, target, out, into)
            if cpu_cv >= cpu.cv or not _below_source(cpu, source, cpu_d, cfg):
                return None
            if not cpu.lowers_cv_despite(source, target, out, into, cfg.pair_gap_min / 2 * cpu.total / cpu.n):
                return None
            after = max(score_cv, cpu_cv)
        gain = spreads.imbalance - after
        if gain <= 0 or gain < cfg.gain_ratio_min * spreads.imbalance:
            return None
        return Candidate(topic, source, target, gain, after, topic_load_score(model.load_of(topic)))


def _below_source(spread: Spread, source: str, new_target: float, cfg: RebalancingConfig) -> bool:
    """Whether the target ends at least ``pair_gap_min`` of the mean below where the
    source was: the pair's hotter end cools by more than report noise, so the target
    does not become the hotspot the move was meant to remove. The target may end above
    the source: a heavy topic leaving a saturated broker for a big idle one is the move
    that helps most, and Σ(load − mean)² still falls, so nothing moves it back."""
    return new_target <= spread.values[source] - cfg.pair_gap_min * spread.total / spread.n
