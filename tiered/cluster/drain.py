"""Draining: a broker in mode ``draining`` (or ``drained`` but still named by a
placement) hands its topics over, ``drain_parallel`` at a time.

Each topic leaves with a transfer to a broker picked by the placement rule (round-robin
in the band, the model updated per pick), lightest topics first. Drains ignore the
blacklist, topic age, cooldowns and the hourly limit: the operator asked for the broker
to be emptied. When no placement names a draining broker any more it is marked
``drained``. Draining brokers never receive topics and do not count in the CV.
"""
from __future__ import annotations

from tiered.cluster.actions import MarkDrained, Transfer
from tiered.cluster.context import Context
from tiered.cluster.scoring import topic_load_score
from tiered.cluster.view import BrokerMode, MoveKind, PlacementState


def drain(ctx: Context) -> None:
    for broker in sorted(ctx.view.brokers):
        info = ctx.view.brokers[broker]
        if not info.registered or info.mode is BrokerMode.ACTIVE:
            continue
        named = ctx.by_broker.get(broker, [])
        incoming = any(p.target == broker for p in ctx.view.placements.values()
                       if p.state is PlacementState.RELEASING)
        if not named and not incoming:
            if info.mode is BrokerMode.DRAINING:
                ctx.act(MarkDrained(broker))
            continue
        in_flight = sum(1 for p in named if p.state is PlacementState.RELEASING)
        slots = ctx.config.drain_parallel - in_flight
        owned = [p.topic for p in named if p.state is PlacementState.OWNED and p.topic not in ctx.touched]
        owned.sort(key=lambda t: (topic_load_score(ctx.model.load_of(t)), t))
        for topic in owned[:max(slots, 0)]:
            to = ctx.choose(topic, {broker})
            if to is None:
                ctx.alarm("NoTarget", broker, "draining, but no broker is eligible to take its topics")
                break
            ctx.act(Transfer(topic, broker, to, MoveKind.DRAIN, ctx.move_id(),
                             topic_load_score(ctx.model.load_of(topic))), topic)
