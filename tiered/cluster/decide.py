"""The decision core: ``decide(view, config, state, now) → Decision``.

A pure function: no I/O, no clock, no randomness, no hidden state. The same view,
configuration, state and time give the same actions (whatever order the view's
mappings were built in), which is what lets the simulator run the production code and
lets a test replay any decision.

One call, in order (a topic gets at most one action per call):

1. complete moves whose source released (:mod:`tiered.cluster.failover`);
2. fail over brokers whose registration vanished, after their grace;
3. re-put or retarget stuck assignments; alarm on stuck releases;
4. place topics with an unassigned marker (round-robin in the 10 % band, model updated
   per pick; a marker for a placed topic is a duplicate and dropped, except an
   operator's unload of an owned topic, which becomes a manual transfer);
5. operator move requests (manual transfers: exempt from the limits, counted by them);
6. drains, ``drain_parallel`` at a time (:mod:`tiered.cluster.drain`);
7. the rebalancing check when due: at most one automatic move
   (:mod:`tiered.cluster.rebalance`).

Every target is a registered, active broker (never draining, drained or dead), and
nothing the core decides deletes data or touches ``/storage/*``.
"""
from __future__ import annotations

from dataclasses import replace

from tiered.cluster.actions import Assign, Decision, DropMarker, RejectRequest, Transfer
from tiered.cluster.config import LoadManagerConfig
from tiered.cluster.history import FUTURE_SKEW_S
from tiered.cluster.context import Context
from tiered.cluster.drain import drain
from tiered.cluster.failover import complete_moves, fail_over, unstick
from tiered.cluster.rebalance import Candidate, Spreads, check, select_move
from tiered.cluster.scoring import balance_stats, topic_load_score
from tiered.cluster.view import ClusterView, CoreState, MoveKind, PlacementState, validate


def decide(view: ClusterView, config: LoadManagerConfig, state: CoreState | None, now: float) -> Decision:
    validate(view)
    state = state or CoreState()
    if state.started_at is None:
        state = replace(state, started_at=now)
    ctx = Context(view, config, state, now)
    if ctx.history.ignored:
        first = max(ctx.history.ignored, key=lambda r: r.last_at)
        ctx.alarm("HistoryFromTheFuture", "/cluster/rebalancing_history",
                  f"{len(ctx.history.ignored)} move(s) dated more than {FUTURE_SKEW_S:.0f}s ahead of this leader's "
                  f"clock, counted by no rule (furthest: {first.move_id} of {first.topic}, "
                  f"{first.last_at - now:.0f}s ahead)")
    rankings = ctx.model.rankings()
    start_balance = balance_stats(ctx.model.balance_loads())
    complete_moves(ctx)
    fail_over(ctx)
    unstick(ctx)
    _assign_markers(ctx)
    _requests(ctx)
    drain(ctx)
    check(ctx)
    wakeups = [w for w in ctx.wakeups if w > now]
    return Decision(
        actions=tuple(ctx.actions),
        state=ctx.state,
        rankings=rankings,
        balance=ctx.balance if ctx.balance is not None else start_balance,
        skipped=tuple(ctx.skipped),
        alarms=tuple(ctx.alarms),
        checked=ctx.checked,
        next_wakeup_at=min(wakeups) if wakeups else None,
    )


def _assign_markers(ctx: Context) -> None:
    markers = sorted(ctx.view.markers.values(), key=lambda m: (m.created_at, m.topic))
    unplaced = 0
    for marker in markers:
        topic = marker.topic
        if topic in ctx.touched:
            continue
        p = ctx.view.placements.get(topic)
        if p is not None and p.state is PlacementState.RELEASING:
            continue  # the marker of a move under way; completing the move clears it
        if p is not None and p.state is not PlacementState.FREE:
            if p.state is PlacementState.OWNED and marker.from_broker == p.broker:
                _transfer(ctx, topic, p.broker, marker.to_broker, MoveKind.MANUAL, None)
            else:
                ctx.act(DropMarker(topic, f"already {p.state.value} on {p.broker}"), topic)
            continue
        exclude = {marker.from_broker}
        if marker.to_broker is not None and marker.to_broker in ctx.model.eligible_targets(exclude):
            to = marker.to_broker
            ctx.model.place(topic, to)
        else:
            to = ctx.choose(topic, exclude)
        if to is None:
            unplaced += 1
            continue
        ctx.act(Assign(topic, to, marker.reason or "new"), topic)
    if unplaced:
        ctx.alarm("NoTarget", "unassigned", f"{unplaced} topic(s) wait for an eligible broker")


def _requests(ctx: Context) -> None:
    for req in sorted(ctx.view.requests, key=lambda r: r.request_id):
        p = ctx.view.placements.get(req.topic)
        if p is None or p.state is PlacementState.FREE:
            ctx.act(RejectRequest(req.request_id, f"topic {req.topic} is not placed"))
        elif p.state is not PlacementState.OWNED or req.topic in ctx.touched:
            ctx.act(RejectRequest(req.request_id, f"topic {req.topic} is {p.state.value}; a move is under way"))
        elif req.to_broker == p.broker:
            ctx.act(RejectRequest(req.request_id, f"topic {req.topic} is already on {p.broker}"))
        elif req.to_broker is not None and req.to_broker not in ctx.model.eligible_targets({p.broker}):
            ctx.act(RejectRequest(req.request_id, f"broker {req.to_broker} is not eligible "
                                                  "(unknown, unregistered, draining, drained, stale or full)"))
        elif not _transfer(ctx, req.topic, p.broker, req.to_broker, MoveKind.MANUAL, req.request_id):
            ctx.act(RejectRequest(req.request_id, "no eligible broker"))


def _transfer(ctx: Context, topic: str, source: str, to: str | None, kind: MoveKind, request_id: str | None) -> bool:
    if to is not None and to in ctx.model.eligible_targets({source}):
        ctx.model.place(topic, to)
    else:
        to = ctx.choose(topic, {source})
    if to is None:
        return False
    ctx.act(Transfer(topic, source, to, kind, ctx.move_id(), topic_load_score(ctx.model.load_of(topic)),
                     request_id=request_id), topic)
    return True


def plan_rebalance(view: ClusterView, config: LoadManagerConfig, now: float, max_moves: int,
                   respect_hourly_limit: bool = True) -> list[Candidate]:
    """The moves an operator's ``rebalance`` would make, one after another, each chosen
    by the same rules on the model as left by the previous one (``--dry-run`` prints
    them). Stops at ``max_moves``, at the hourly budget, when the imbalance the
    hysteresis watches falls below ``stop_ratio × threshold`` or when no move helps."""
    validate(view)
    ctx = Context(view, config, CoreState(started_at=now), now)
    cfg = config.rebalancing
    eff = cfg.effective()
    budget = max_moves
    if respect_hourly_limit:
        budget = min(budget, max(eff.max_moves_per_hour - ctx.history.moves_in_last_hour(now), 0))
    planned: list[Candidate] = []
    moved: set[str] = set()
    while len(planned) < budget:
        if not ctx.model.balance_set or Spreads(ctx.model).trigger < cfg.stop_ratio * eff.cv_threshold:
            break
        move = select_move(ctx.model, view, ctx.owned, ctx.history, cfg, eff, now, exclude=moved)
        if move is None:
            break
        ctx.model.place(move.topic, move.target)
        moved.add(move.topic)
        planned.append(move)
    return planned
