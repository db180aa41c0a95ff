"""``dnb cluster ACTION``: the load manager's operator commands (every one with ``--json``).

``run``: a load-manager candidate on its own (no broker), until SIGTERM.

Read-only: ``brokers`` (registration, mode, load, score), ``leader``, ``balance`` (CV,
mean, σ, min/max and rankings, optionally under another ``--strategy``), ``moves``
(placements in flux and pending requests), ``history [--topic T] [--since EPOCH_S]``,
``rebalance --dry-run [--max-moves N]``.

Inputs for the leader (it acts on them, fenced): ``assign TOPIC [--to B]`` (place a new
topic), ``move TOPIC [--to B]`` (a manual transfer of a placed topic), ``drain B``,
``undrain B``, ``pause``, ``resume``.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from typing import Any

from tiered.cluster import admin
from tiered.cluster.config import LoadManagerConfig
from tiered.cluster.runtime import LoadManager, load_manager_settings
from tiered.metadata import open_metadata
from tiered.tools.cli.output import CliError, Output, render_mapping, render_table
from tiered.tools.cli.settings import Settings

ACTIONS = ("run", "brokers", "leader", "balance", "moves", "history", "rebalance", "assign", "move", "drain", "undrain",
           "pause", "resume")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=ACTIONS, help="what to show or request (see `dnb cluster --help`)")
    p.add_argument("subject", nargs="?", default=None, help="topic (assign, move, history) or broker id (drain)")
    p.add_argument("--to", default=None, help="target broker (assign, move)")
    p.add_argument("--topic", default=None, help="history of one topic")
    p.add_argument("--since", type=float, default=None, help="history since this Unix time (seconds)")
    p.add_argument("--dry-run", action="store_true", help="rebalance: print the moves, change nothing")
    p.add_argument("--max-moves", type=int, default=10, help="rebalance: at most this many moves (default 10)")
    p.add_argument("--load-manager-config", default=os.environ.get("DNB_LOAD_MANAGER_CONFIG"), metavar="FILE",
                   help="run: JSON load_manager section (+ leader_ttl_s, poll_interval_s)")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print one JSON object (same as the global --json)")
    p.add_argument("--strategy", default=None, choices=("fair", "balanced", "weighted_load"),
                   help="balance/brokers: score with this strategy instead (what-if)")


def run(args: argparse.Namespace, settings: Settings, out: Output) -> int | None:
    config = LoadManagerConfig() if args.strategy is None else LoadManagerConfig(assignment_strategy=args.strategy)
    action = args.action
    needs = {"assign": "topic", "move": "topic", "drain": "broker id", "undrain": "broker id"}
    if action in needs and not args.subject:
        raise CliError(f"dnb cluster {action} needs a {needs[action]}")
    if action == "rebalance" and not args.dry_run:
        raise CliError("only `dnb cluster rebalance --dry-run` exists: automatic rebalancing is the leader's "
                       "(enable it in the load-manager config; pause/resume it with `dnb cluster pause|resume`)")
    if settings.metadata_url.startswith("sqlite:"):
        os.makedirs(settings.data_dir, exist_ok=True)
    metadata = open_metadata(settings.metadata_url)
    try:
        if action == "run":
            return _run_manager(metadata, settings, args.load_manager_config)
        if action == "brokers":
            result = admin.brokers(metadata, config)
            out.emit(result, render=_render_brokers)
        elif action == "leader":
            out.emit(admin.leader(metadata), render=render_mapping)
        elif action == "balance":
            out.emit(admin.balance(metadata, config), render=_render_balance)
        elif action == "moves":
            out.emit(admin.moves(metadata), render=_render_moves)
        elif action == "history":
            topic = args.topic or args.subject
            out.emit(admin.history(metadata, topic, args.since), render=_render_history)
        elif action == "rebalance":
            out.emit(admin.rebalance_plan(metadata, config, args.max_moves), render=_render_plan)
        elif action == "assign":
            placed = admin.request_topic(metadata, args.subject, args.to)
            out.emit({"topic": args.subject, "to": args.to, "requested": placed}, render=render_mapping)
            return None if placed else 3
        elif action == "move":
            out.emit(admin.request_move(metadata, args.subject, args.to), render=render_mapping)
        elif action in ("drain", "undrain"):
            mode = "draining" if action == "drain" else "active"
            out.emit(admin.set_mode(metadata, args.subject, mode), render=render_mapping)
        elif action in ("pause", "resume"):
            out.emit(admin.set_paused(metadata, action == "pause"), render=render_mapping)
    finally:
        metadata.close()
    return None


def _run_manager(metadata, settings: Settings, config_path: str | None) -> int:
    """A load-manager candidate without a broker: campaigns, and while leader places and
    moves topics; SIGTERM/SIGINT resigns and exits 0. Its id is ``--broker-id`` (any
    unique name: it is only the leader record's ``broker_id``)."""
    logging.getLogger("tiered").setLevel(logging.INFO)
    config, runtime = load_manager_settings(config_path)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    manager = LoadManager(metadata, settings.broker_id, config, runtime).start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        manager.stop(resign=True)
    return 0


def _render_brokers(r: dict[str, Any]) -> str:
    cols = ["broker_id", "registered", "mode", "topics", "assigning", "releasing", "score", "report_age_s",
            "cpu_pct", "mem_pct", "address"]
    return render_table(cols, [[_fmt(b[c]) for c in cols] for b in r["brokers"]])


def _render_balance(r: dict[str, Any]) -> str:
    b = r["balance"]
    head = "no active broker with a score" if b is None else (
        f"strategy {r['strategy']}: CV {b['cv']:.3f}  mean {b['mean']:.3f}  σ {b['std_dev']:.3f}  "
        f"min {b['min_load']:.3f}  max {b['max_load']:.3f}  ({b['brokers']} brokers)")
    return head + "\n" + render_table(["broker_id", "score"], [[x["broker_id"], _fmt(x["score"])]
                                                                for x in r["rankings"]])


def _render_moves(r: dict[str, Any]) -> str:
    cols = ["topic", "state", "broker", "target", "kind", "attempts"]
    text = render_table(cols, [[_fmt(m[c]) for c in cols] for m in r["in_flight"]])
    if r["requests"]:
        text += "\npending requests:\n" + render_table(["topic", "reason", "from", "to"], [
            [_fmt(m[c]) for c in ("topic", "reason", "from", "to")] for m in r["requests"]])
    return text


def _render_history(r: dict[str, Any]) -> str:
    cols = ["started", "topic", "from_broker", "to_broker", "kind", "completed"]
    rows = [[time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(h["started_at"])), h["topic"], h["from_broker"],
             h["to_broker"], h["kind"], "yes" if h["completed_at"] else "no"] for h in r["history"]]
    return render_table(cols, rows)


def _render_plan(r: dict[str, Any]) -> str:
    if not r["moves"]:
        return "no move would help now (balanced, within limits, or no candidate)"
    cols = ["topic", "source", "target", "gain", "cv_after"]
    return render_table(cols, [[_fmt(m[c]) for c in cols] for m in r["moves"]])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)
