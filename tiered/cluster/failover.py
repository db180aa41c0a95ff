"""Moves in flight and brokers that vanished.

**Completing a move (M3).** A ``releasing`` placement whose source has sealed and
released is assigned to the target chosen at unload time, or, if that broker is no
longer registered and active, to another one picked now (``retargeted``).

**Failover.** A broker whose registration vanished keeps its topics for a grace period:
if it re-registers in time, it recovers its own WAL and loses nothing. The grace is
``grace_s`` while the leader's own session has been healthy for ``stable_after_s``, else
``grace_unstable_s`` (the leader may itself have missed events). Failover is suspended,
with an alarm, while the leader's session is unhealthy, and when more than
``mass_fraction`` of the known brokers vanished within ``mass_window_s`` of each other
(a store or network fault looks like that, and moving every topic at once would make it
worse) until ``mass_hold_s`` after the last of them. Once due, every placement naming
the broker is reassigned; the runtime's transaction also requires the broker's
registration to still be absent, so a broker that comes back at the last moment keeps
its topics. Failovers are exempt from the hourly limit and cooldowns.

**Stuck states.** An assignment not confirmed after ``assign_timeout_s`` is re-put (the
broker's watcher retries), and after ``assign_retries_max`` re-puts given to another
broker. A release that takes longer than ``release_timeout_s`` raises an alarm and
nothing else: the source is alive and sealing (its assignment watcher retries a failing
seal until it lands), and forcing would fence a live owner.
"""
from __future__ import annotations

from tiered.cluster.actions import CompleteTransfer, Reassign, RetryAssign
from tiered.cluster.context import Context
from tiered.cluster.view import MoveKind, PlacementState


def complete_moves(ctx: Context) -> None:
    for p in ctx.unsettled:
        topic = p.topic
        if p.state is not PlacementState.RELEASING or not p.source_released or topic in ctx.touched:
            continue
        if p.target != p.broker and ctx.is_active(p.target):
            ctx.act(CompleteTransfer(topic, p.broker, p.target, p.move_id, retargeted=False), topic)
            continue
        to = ctx.choose(topic, {p.broker, p.target})
        if to is None:
            ctx.alarm("NoTarget", topic, f"released by {p.broker}; target {p.target} is gone and no broker is eligible")
            continue
        ctx.act(CompleteTransfer(topic, p.broker, to, p.move_id, retargeted=True), topic)


def fail_over(ctx: Context) -> None:
    view, cfg, now = ctx.view, ctx.config.failover, ctx.now
    dead = {b: info for b, info in view.brokers.items() if not info.registered}
    pending = sorted(b for b in dead if any(_needs_failover(p) for p in ctx.by_broker.get(b, ())))
    if not pending:
        return
    if not view.leader.session_healthy:
        ctx.alarm("FailoverSuspended", ",".join(pending), "the leader's metadata session is unhealthy")
        return
    stable = view.leader.healthy_since is not None and now - view.leader.healthy_since >= cfg.stable_after_s
    grace_s = cfg.grace_s if stable else cfg.grace_unstable_s
    for broker in pending:
        since = dead[broker].unregistered_since
        cohort = [info.unregistered_since for info in dead.values()
                  if abs(info.unregistered_since - since) <= cfg.mass_window_s]
        if len(cohort) > cfg.mass_fraction * len(view.brokers):
            hold_until = max(cohort) + cfg.mass_hold_s
            if now < hold_until:
                ctx.alarm("FailoverSuspended", broker,
                          f"{len(cohort)} of {len(view.brokers)} brokers vanished within {cfg.mass_window_s}s")
                ctx.wake_at(hold_until)
                continue
        if now < since + grace_s:
            ctx.wake_at(since + grace_s)
            continue
        _reassign_all(ctx, broker)


def _needs_failover(p) -> bool:
    """A placement whose broker must be replaced when that broker is gone. A source that
    released already is done; completing its move needs no failover."""
    return not (p.state is PlacementState.RELEASING and p.source_released)


def _reassign_all(ctx: Context, broker: str) -> None:
    for p in ctx.by_broker.get(broker, ()):
        if not _needs_failover(p) or p.topic in ctx.touched:
            continue
        planned = p.target if p.state is PlacementState.RELEASING else None
        if ctx.is_active(planned) and planned in ctx.model.eligible_targets({broker}):
            to = planned
        else:
            to = ctx.choose(p.topic, {broker})
        if to is None:
            ctx.alarm("NoTarget", p.topic, f"broker {broker} is gone and no broker is eligible")
            continue
        ctx.act(Reassign(p.topic, broker, to, MoveKind.FAILOVER.value, ctx.move_id()), p.topic)


def unstick(ctx: Context) -> None:
    cfg, now = ctx.config, ctx.now
    for p in ctx.unsettled:
        topic = p.topic
        if topic in ctx.touched:
            continue
        info = ctx.view.brokers.get(p.broker) if p.broker is not None else None
        if info is None or not info.registered:
            continue  # failover's business
        if p.state is PlacementState.ASSIGNING:
            due = p.updated_at + cfg.assign_timeout_s
            if now < due:
                ctx.wake_at(due)
            elif p.attempts < cfg.assign_retries_max:
                ctx.act(RetryAssign(topic, p.broker, p.attempts + 1), topic)
            else:
                to = ctx.choose(topic, {p.broker})
                if to is None:
                    ctx.alarm("NoTarget", topic, f"{p.broker} did not load it and no other broker is eligible")
                    continue
                ctx.act(Reassign(topic, p.broker, to, "retarget", ctx.move_id()), topic)
        elif p.state is PlacementState.RELEASING and not p.source_released:
            due = p.updated_at + cfg.release_timeout_s
            if now < due:
                ctx.wake_at(due)
            else:
                ctx.alarm("ReleaseStuck", topic,
                          f"{p.broker} has not sealed it for {now - p.updated_at:.0f}s (no forced takeover)")
