"""Operator functions behind ``dnb cluster ...``: read the load manager's state, and
write the few inputs an operator owns (topic requests, broker modes, pause/resume).

Operators never write placements or assignments of placed topics: those belong to the
leader (fenced). What an operator writes here is an input the leader reads:

* ``request_topic`` — the unassigned marker of a new topic (create-if-absent), the seed's
  "empty = new"; with ``to_broker`` a placement hint the leader honours when eligible.
* ``request_move`` — a marker naming the current owner and a target: the leader turns it
  into a manual transfer (seal where it is, then assign the target).
* ``set_mode`` — ``/cluster/broker_state/<b>`` active/draining (drained is the leader's).
* ``set_paused`` — ``/cluster/lm/config``.
* ``request_rebalance`` — ``/cluster/lm/rebalance_request``: one rebalancing cycle now,
  run by the leader under its rules and limits; it answers in the record.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict
from typing import Any

from tiered.cluster import records
from tiered.cluster.config import LoadManagerConfig
from tiered.cluster.errors import ClusterError
from tiered.cluster.decide import decide, plan_rebalance
from tiered.cluster.leader import read_leader
from tiered.cluster.observe import ViewBuilder, read_snapshot
from tiered.metadata import keys
from tiered.metadata.base import Delete, MetadataStore, Put, absent, mod_revision_is
from wal.topics import TopicName


class RequestRefused(ClusterError):
    """An operator request refused (nothing was written); says what was found."""


def request_topic(metadata: MetadataStore, topic: str, to_broker: str | None = None) -> bool:
    """Ask the leader to place ``topic``; False if it is already placed or requested."""
    name = TopicName.parse(topic)
    if to_broker is not None:
        keys.broker_assignments_prefix(to_broker)  # validates the id (ValueError: nothing written)
    marker = keys.Unassigned("new", None, to_broker)
    placement = records.placement_key(name)
    result = metadata.txn([absent(keys.unassigned_key(name)), absent(placement)],
                          [Put(keys.unassigned_key(name), marker.to_json())])
    return result.succeeded


def request_move(metadata: MetadataStore, topic: str, to_broker: str | None) -> dict[str, Any]:
    """Ask the leader to move an owned topic (to ``to_broker`` or wherever it picks)."""
    name = TopicName.parse(topic)
    if to_broker is not None:
        keys.broker_assignments_prefix(to_broker)  # validates the id (ValueError: nothing written)
    kv = metadata.get(records.placement_key(name))
    if kv is None:
        raise RequestRefused(f"topic {name} has no placement record (not managed by the load manager)")
    placement = records.decode(records.PlacementRecord, kv.key, kv.value)
    if placement.state != "owned":
        raise RequestRefused(f"topic {name} is {placement.state} on {placement.broker}; a move is under way")
    if placement.broker == to_broker:
        raise RequestRefused(f"topic {name} is already on {to_broker}")
    marker = keys.Unassigned("move", placement.broker, to_broker)
    ok = metadata.txn([absent(keys.unassigned_key(name))], [Put(keys.unassigned_key(name), marker.to_json())])
    if not ok.succeeded:
        raise RequestRefused(f"topic {name} already has a pending request")
    return {"topic": str(name), "from": placement.broker, "to": to_broker, "requested": True}


def set_mode(metadata: MetadataStore, broker_id: str, mode: str, by: str = "operator") -> dict[str, Any]:
    if mode not in ("active", "draining"):
        raise RequestRefused(f"mode {mode!r}: an operator sets active or draining (drained is the leader's)")
    record = records.BrokerStateRecord(mode, f"set by {by}", time.time(), by)
    metadata.put(records.broker_state_key(broker_id), records.encode(record))
    return {"broker_id": broker_id, "mode": mode}


def set_paused(metadata: MetadataStore, paused: bool) -> dict[str, Any]:
    metadata.put(records.LM_CONFIG_KEY, records.encode(records.LmOverrides(paused=paused)))
    return {"paused": paused}


def leader(metadata: MetadataStore) -> dict[str, Any]:
    info = read_leader(metadata)
    if info is None:
        return {"leader": None}
    return {"leader": info.broker_id, "term": info.term, "elected_at": info.elected_at}


def brokers(metadata: MetadataStore, config: LoadManagerConfig | None = None) -> dict[str, Any]:
    config = config or LoadManagerConfig()
    snap = read_snapshot(metadata)
    now = time.time()
    view = ViewBuilder(config).build(snap, now)
    decision = decide(view, config.with_rebalancing(enabled=False), None, now)
    scores = dict(decision.rankings)
    rows = []
    for b, info in sorted(view.brokers.items()):
        counts = {s: 0 for s in ("owned", "assigning", "releasing")}
        for p, _ in snap.placements.values():
            if p.broker == b and p.state in counts:
                counts[p.state] += 1
        report = snap.reports.get(b)
        address = None
        if b in snap.registered:
            try:
                import json

                address = json.loads(snap.registered[b].value).get("address")
            except (ValueError, AttributeError, RecursionError):  # junk, not an object, nested too deep
                address = None
        rows.append({
            "broker_id": b, "registered": info.registered, "mode": info.mode.value, "address": address,
            "topics": counts["owned"], "assigning": counts["assigning"], "releasing": counts["releasing"],
            "score": scores.get(b),
            "report_age_s": None if report is None else round(now - report.ts, 3),
            "cpu_pct": None if report is None else report.cpu_pct,
            "mem_pct": None if report is None else report.mem_pct,
            "reported_topics": None if report is None else len(report.topics),
        })
    return {"brokers": rows}


def balance(metadata: MetadataStore, config: LoadManagerConfig | None = None) -> dict[str, Any]:
    config = config or LoadManagerConfig()
    now = time.time()
    view = ViewBuilder(config).build(read_snapshot(metadata), now)
    decision = decide(view, config.with_rebalancing(enabled=False), None, now)
    stats = decision.balance
    return {"strategy": config.assignment_strategy.value,
            "balance": None if stats is None else asdict(stats),
            "rankings": [{"broker_id": b, "score": s} for b, s in decision.rankings]}


def moves(metadata: MetadataStore) -> dict[str, Any]:
    snap = read_snapshot(metadata)
    rows = [{"topic": t, "state": p.state, "broker": p.broker, "target": p.target, "kind": p.kind,
             "move_id": p.move_id, "since": p.updated_at, "attempts": p.attempts}
            for t, (p, _) in sorted(snap.placements.items()) if p.state != "owned"]
    markers = [{"topic": t, "reason": m.reason, "from": m.from_broker, "to": m.to_broker}
               for t, (m, _) in sorted(snap.markers.items())]
    return {"in_flight": rows, "requests": markers}


def history(metadata: MetadataStore, topic: str | None = None, since: float | None = None) -> dict[str, Any]:
    name = str(TopicName.parse(topic)) if topic else None
    rows = []
    for kv in metadata.range(records.HISTORY_PREFIX):
        h = records.decode(records.HistoryRecord, kv.key, kv.value)
        if name is not None and h.topic != name:
            continue
        if since is not None and h.started_at < since:
            continue
        rows.append(asdict(h))
    return {"history": rows}


def rebalance_plan(metadata: MetadataStore, config: LoadManagerConfig | None = None,
                   max_moves: int = 10) -> dict[str, Any]:
    """``rebalance --dry-run``: the moves the rules would make now, one after another."""
    config = config or LoadManagerConfig()
    now = time.time()
    view = ViewBuilder(config).build(read_snapshot(metadata), now)
    plan = plan_rebalance(view, config, now, max_moves)
    return {"dry_run": True, "moves": [asdict(m) for m in plan]}


def request_rebalance(metadata: MetadataStore, timeout_s: float = 30.0, by: str = "operator",
                      poll_s: float = 0.05) -> dict[str, Any]:
    """``rebalance`` (not ``--dry-run``): ask the leader for one rebalancing cycle now and
    wait up to ``timeout_s`` for its answer.

    Nothing here writes a placement: the leader runs the cycle with its usual gates
    (pause, warm-up, stale reports, moves in flight, settling), hysteresis thresholds,
    hourly limit, cooldowns, blacklist and candidate rules, and answers in the request
    record (fenced; a move and its answer are one write). Unanswered in time (no leader,
    say), the request is withdrawn (deleted only if still pending and unchanged), so it
    cannot start a move later; ``answered`` is then False."""
    request_id = uuid.uuid4().hex[:16]
    record = records.RebalanceRequestRecord(request_id, time.time(), by)
    key = records.REBALANCE_REQUEST_KEY
    current = metadata.get(key)
    if current is not None:
        held = records.decode(records.RebalanceRequestRecord, key, current.value)
        if held.state == "pending":
            raise RequestRefused(f"rebalance request {held.request_id} is pending already")
        guard = mod_revision_is(key, current.mod_revision)
    else:
        guard = absent(key)
    if not metadata.txn([guard], [Put(key, records.encode(record))]).succeeded:
        raise RequestRefused("another rebalance request was made at the same time")
    deadline = time.monotonic() + timeout_s
    while True:
        kv = metadata.get(key)
        held = records.decode(records.RebalanceRequestRecord, key, kv.value) if kv is not None else None
        if held is None or held.request_id != request_id:
            return {"request_id": request_id, "answered": False, "outcome": "withdrawn by someone else", "moves": []}
        if held.state == "answered":
            return {"request_id": request_id, "answered": True, "outcome": held.outcome, "moves": held.moves,
                    "term": held.term}
        if time.monotonic() >= deadline:
            assert kv is not None
            if metadata.txn([mod_revision_is(key, kv.mod_revision)], [Delete(key)]).succeeded:
                return {"request_id": request_id, "answered": False,
                        "outcome": f"no leader answered within {timeout_s:g}s; request withdrawn", "moves": []}
            continue  # answered just now: read the answer
        time.sleep(poll_s)
