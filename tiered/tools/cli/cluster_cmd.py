"""``dnb cluster ACTION``: the load manager's operator commands (every one with ``--json``),
each a few lines over :mod:`tiered.cluster.admin`.

``run``: a load-manager candidate on its own (no broker), until SIGTERM.

Read-only: ``brokers`` (registration, mode, load, score), ``leader``, ``balance`` (CV,
mean, σ, min/max and rankings, optionally under another ``--strategy``), ``moves``
(placements in flux and pending requests), ``history [--topic T] [--since EPOCH_S]``,
``rebalance --dry-run [--max-moves N]``.

``rebalance`` without ``--dry-run``: the leader runs one rebalancing cycle now (at most
one move, under every rule and limit of automatic rebalancing) and answers; exit 3 if
it moved nothing or no leader answered within ``--timeout``.

Inputs for the leader (it acts on them, fenced): ``assign TOPIC [--to B]`` (place a new
topic), ``move TOPIC [--to B]`` (a manual transfer of a placed topic), ``drain B``,
``undrain B``, ``pause``, ``resume``.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from tiered.tools.cli.app import DnbGroup, Invocation, pass_invocation
from tiered.tools.cli.output import EXIT_REFUSED, render_mapping, render_table
from tiered.tools.cli.settings import Settings

STRATEGIES = ("fair", "balanced", "weighted_load")


@click.group("cluster", cls=DnbGroup, help="load manager: brokers, leader, balance, moves, history, assign/move, "
             "drain/undrain, pause/resume, rebalance [--dry-run]")
def cluster() -> None:
    pass


@contextmanager
def _metadata(settings: Settings) -> Iterator[Any]:
    from tiered.metadata import open_metadata  # deferred: keeps `dnb --help` light

    if settings.metadata_url.startswith("sqlite:"):
        os.makedirs(settings.data_dir, exist_ok=True)
    metadata = open_metadata(settings.metadata_url)
    try:
        yield metadata
    finally:
        metadata.close()


def _config(strategy: str | None) -> Any:
    from tiered.cluster.config import LoadManagerConfig  # deferred: keeps `dnb --help` light

    return LoadManagerConfig() if strategy is None else LoadManagerConfig(assignment_strategy=strategy)


def _show(inv: Invocation, call: Callable[[Any, Any], dict[str, Any]], render: Callable[[dict[str, Any]], str]) -> None:
    """Open the metadata store, ``call(admin, metadata)`` (a view or an operator input of
    :mod:`tiered.cluster.admin`), print its result."""
    from tiered.cluster import admin  # deferred: keeps `dnb --help` light

    with _metadata(inv.settings()) as metadata:
        inv.out.emit(call(admin, metadata), render=render)


strategy_option = click.option("--strategy", type=click.Choice(STRATEGIES), default=None,
                               help="score with this strategy instead (what-if)")


@cluster.command("run", help="a load-manager candidate on its own (no broker), until SIGTERM")
@click.option("--load-manager-config", envvar="DNB_LOAD_MANAGER_CONFIG", metavar="FILE",
              help="JSON load_manager section (+ leader_ttl_s, poll_interval_s) (env DNB_LOAD_MANAGER_CONFIG)")
@pass_invocation
def run(inv: Invocation, load_manager_config: str | None) -> int:
    inv.long_lived()
    settings = inv.settings()
    with _metadata(settings) as metadata:
        return _run_manager(metadata, settings, load_manager_config)


@cluster.command("brokers", help="registration, mode, load and score of every broker")
@strategy_option
@pass_invocation
def brokers(inv: Invocation, strategy: str | None) -> None:
    _show(inv, lambda admin, m: admin.brokers(m, _config(strategy)), _render_brokers)


@cluster.command("leader", help="the elected load-manager leader and its term")
@pass_invocation
def leader(inv: Invocation) -> None:
    _show(inv, lambda admin, m: admin.leader(m), render_mapping)


@cluster.command("balance", help="CV, mean, σ, min/max load and the broker rankings")
@strategy_option
@pass_invocation
def balance(inv: Invocation, strategy: str | None) -> None:
    _show(inv, lambda admin, m: admin.balance(m, _config(strategy)), _render_balance)


@cluster.command("moves", help="placements in flux and pending requests")
@pass_invocation
def moves(inv: Invocation) -> None:
    _show(inv, lambda admin, m: admin.moves(m), _render_moves)


@cluster.command("history", help="completed and running moves, optionally of one topic or since a time")
@click.argument("subject", required=False)
@click.option("--topic", default=None, help="history of one topic (same as the argument)")
@click.option("--since", type=float, default=None, help="since this Unix time (seconds)")
@pass_invocation
def history(inv: Invocation, subject: str | None, topic: str | None, since: float | None) -> None:
    _show(inv, lambda admin, m: admin.history(m, topic or subject, since), _render_history)


@cluster.command("rebalance", help="ask the leader for one rebalancing cycle now (exit 3 if nothing moved); "
                 "--dry-run: the moves it would make, changing nothing")
@click.option("--dry-run", is_flag=True, help="print the moves, change nothing")
@click.option("--max-moves", type=int, default=10, show_default=True, help="--dry-run: at most this many moves")
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="seconds to wait for the leader's answer (then the request is withdrawn)")
@strategy_option
@pass_invocation
def rebalance(inv: Invocation, dry_run: bool, max_moves: int, timeout_s: float, strategy: str | None) -> int | None:
    if dry_run:
        _show(inv, lambda admin, m: admin.rebalance_plan(m, _config(strategy), max_moves), _render_plan)
        return None
    if strategy is not None:
        raise click.UsageError("--strategy is a what-if of --dry-run; the leader rebalances with its own strategy")
    from tiered.cluster import admin  # deferred: keeps `dnb --help` light

    with _metadata(inv.settings()) as metadata:
        answer = admin.request_rebalance(metadata, timeout_s)
    inv.out.emit(answer, render=_render_answer)
    return None if answer["outcome"] == "moved" else EXIT_REFUSED


@cluster.command("assign", help="place a new topic (optionally on --to BROKER); exit 3 if already requested")
@click.argument("topic")
@click.option("--to", "to_broker", default=None, help="target broker")
@pass_invocation
def assign(inv: Invocation, topic: str, to_broker: str | None) -> int | None:
    from tiered.cluster import admin  # deferred: keeps `dnb --help` light

    with _metadata(inv.settings()) as metadata:
        placed = admin.request_topic(metadata, topic, to_broker)
    inv.out.emit({"topic": topic, "to": to_broker, "requested": placed}, render=render_mapping)
    return None if placed else EXIT_REFUSED


@cluster.command("move", help="a manual transfer of a placed topic (to --to BROKER, or the leader's choice)")
@click.argument("topic")
@click.option("--to", "to_broker", default=None, help="target broker")
@pass_invocation
def move(inv: Invocation, topic: str, to_broker: str | None) -> None:
    _show(inv, lambda admin, m: admin.request_move(m, topic, to_broker), render_mapping)


@cluster.command("drain", help="move every topic off BROKER and place nothing new on it")
@click.argument("broker", metavar="BROKER")
@pass_invocation
def drain(inv: Invocation, broker: str) -> None:
    _show(inv, lambda admin, m: admin.set_mode(m, broker, "draining"), render_mapping)


@cluster.command("undrain", help="let BROKER take topics again")
@click.argument("broker", metavar="BROKER")
@pass_invocation
def undrain(inv: Invocation, broker: str) -> None:
    _show(inv, lambda admin, m: admin.set_mode(m, broker, "active"), render_mapping)


@cluster.command("pause", help="pause the leader's automatic rebalancing")
@pass_invocation
def pause(inv: Invocation) -> None:
    _show(inv, lambda admin, m: admin.set_paused(m, True), render_mapping)


@cluster.command("resume", help="resume the leader's automatic rebalancing")
@pass_invocation
def resume(inv: Invocation) -> None:
    _show(inv, lambda admin, m: admin.set_paused(m, False), render_mapping)


def _run_manager(metadata: Any, settings: Settings, config_path: str | None) -> int:
    """A load-manager candidate without a broker: campaigns, and while leader places and
    moves topics; SIGTERM/SIGINT resigns and exits 0. Its id is ``--broker-id`` (any
    unique name: it is only the leader record's ``broker_id``)."""
    from tiered.cluster.runtime import LoadManager, load_manager_settings  # deferred: keeps `dnb --help` light

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


def _render_answer(r: dict[str, Any]) -> str:
    if r["outcome"] != "moved":
        return f"nothing moved: {r['outcome']}"
    cols = ["topic", "from", "to", "cv_before", "cv_after"]
    return render_table(cols, [[_fmt(m[c]) for c in cols] for m in r["moves"]])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)
