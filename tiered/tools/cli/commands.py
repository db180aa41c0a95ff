"""One function per ``dnb`` command: parse its arguments, call the library, print.

Each command is a :class:`Command` with an ``add_arguments`` and a ``run``; ``run``
returns an exit code (or None for success). The JSON keys printed here are the CLI's
contract (docs/CLI.md) and are pinned by tests/cli.
"""
from __future__ import annotations

import argparse
import base64
import enum
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tiered.tools.cli.output import EXIT_PROBLEMS, EXIT_RECORDED_LOSS, CliError, Output, render_mapping, render_table
from tiered.tools.cli.settings import Settings, redact_url

Handler = Callable[[argparse.Namespace, Settings, Output], "int | None"]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Handler


def _topic_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic", type=_topic_name, help="topic name, e.g. /default/reliable_topic")


def _topic_name(raw: str) -> str:
    """The canonical ``/namespace/topic`` form only: an operator typing ``ns/t`` most
    likely meant something else, and a typo must not create or move a topic."""
    from wal.errors import InvalidTopicName  # deferred: keeps `dnb --help` light
    from wal.topics import TopicName  # deferred: keeps `dnb --help` light

    if not raw.startswith("/"):
        raise argparse.ArgumentTypeError(f"topic name {raw!r} must start with '/' (/namespace/topic)")
    try:
        return str(TopicName.parse(raw))
    except InvalidTopicName as e:
        raise argparse.ArgumentTypeError(str(e)) from e


# -- produce ----------------------------------------------------------------------------

def _produce_args(p: argparse.ArgumentParser) -> None:
    _topic_arg(p)
    p.add_argument("--count", type=_non_negative, default=None,
                   help="append N generated messages (default: one message per stdin line)")
    p.add_argument("--size", type=_non_negative, default=None,
                   help="payload size in bytes of generated messages (default: 'message-<i>')")
    p.add_argument("--key", default=None, help="message key for every message")
    p.add_argument("--ack", choices=("durable", "archived"), default="durable",
                   help="wait until fsynced locally (default) or inside a committed object")
    _broker_url_arg(p)


def _broker_url_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--broker", default=os.environ.get("DNB_BROKER_URL"), metavar="URL",
                   help="talk to a running `dnb broker` (any one: it redirects to the owner) instead of "
                        "hosting the topic in this process (env DNB_BROKER_URL)")


def _produce(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    payloads = ops.generated_payloads(args.count, args.size) if args.count is not None \
        else ops.stdin_payloads(sys.stdin)
    key = args.key.encode() if args.key is not None else None
    if args.broker:
        result = ops.produce_remote(args.broker, args.topic, payloads, key=key, ack=args.ack)
    else:
        result = ops.produce(settings, args.topic, payloads, key=key, ack=args.ack)
    out.emit({"first_offset": result[0], "last_offset": result[1]})


# -- upload -----------------------------------------------------------------------------

def _upload(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    out.emit({"committed_through": ops.upload(settings, args.topic)})


# -- consume ----------------------------------------------------------------------------

def _consume_args(p: argparse.ArgumentParser) -> None:
    _topic_arg(p)
    p.add_argument("--subscription", required=True, help="subscription name (its cursor lives in metadata)")
    p.add_argument("--from", dest="start", default=None,
                   help="earliest, latest or an offset; default: the cursor + 1, else earliest")
    p.add_argument("--max", type=_non_negative, default=None, help="stop after N messages")
    p.add_argument("--ack", action="store_true", help="acknowledge what was read and flush the cursor")
    p.add_argument("--follow", action="store_true", help="keep waiting for new messages (Ctrl-C stops)")
    p.add_argument("--idle-timeout-s", type=float, default=None,
                   help="with --follow, stop after this long without a message")
    _broker_url_arg(p)


def _consume(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    start = _parse_start(args.start)
    if args.broker:
        if args.follow or not (isinstance(start, int) or start == "earliest"):
            raise CliError("with --broker, give --from earliest or an offset (no --follow)")
        messages = ops.consume_remote(args.broker, args.topic, args.subscription, 0 if start == "earliest" else start,
                                      max_messages=args.max, ack=args.ack)
    else:
        messages = ops.consume(settings, args.topic, args.subscription, start=start, max_messages=args.max,
                               ack=args.ack, follow=args.follow, idle_timeout_s=args.idle_timeout_s)
    rows = [message_json(m) for m in messages]
    out.emit({"messages": rows}, render=_render_messages)


def message_json(message: Any) -> dict[str, Any]:
    """``{offset, tier, payload, encoding}``: payload as UTF-8 text when it decodes, else base64."""
    try:
        payload, encoding = message.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(message.payload).decode("ascii"), "base64"
    return {"offset": message.offset, "tier": message.tier, "payload": payload, "encoding": encoding}


def _render_messages(result: dict[str, Any]) -> str:
    rows = [(m["offset"], m["tier"], _clip(m["payload"]) + (" (base64)" if m["encoding"] == "base64" else ""))
            for m in result["messages"]]
    return render_table(("offset", "tier", "payload"), rows) + f"\n{len(rows)} message(s)"


def _clip(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _parse_start(raw: str | None) -> str | int | None:
    if raw is None or raw in ("earliest", "latest"):
        return raw
    try:
        value = int(raw)
    except ValueError:
        raise CliError(f"--from {raw!r}: use earliest, latest or a non-negative offset") from None
    if value < 0:
        raise CliError(f"--from {raw!r}: offsets are non-negative")
    return value


# -- seal / restore ---------------------------------------------------------------------

def _seal(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    out.emit({"last_committed_offset": ops.seal(settings, args.topic)})


def _restore_args(p: argparse.ArgumentParser) -> None:
    _topic_arg(p)
    p.add_argument("--takeover", action="store_true",
                   help="take the topic from a broker that died without sealing (failover)")
    p.add_argument("--discard-local-wal", action="store_true",
                   help="this broker's local WAL of the topic does not open: quarantine it, record the "
                        "offsets it may have held as lost, and continue after the archive")


def _restore(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    out.emit({"next_offset": ops.restore(settings, args.topic, takeover=args.takeover,
                                         discard_local_wal=args.discard_local_wal)})


# -- inspect ----------------------------------------------------------------------------

def _inspect(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    out.emit(ops.inspect(settings, args.topic), render=_render_inspect)


def _render_inspect(result: dict[str, Any]) -> str:
    head = {k: v for k, v in result.items() if k not in ("descriptors", "cursors", "lost_ranges")}
    parts = [render_mapping(head), "", "descriptors:"]
    parts.append(render_table(("start", "end", "object", "size", "broker", "epoch"),
                              [(d["start_offset"], d["end_offset"], d["object_id"], d["size"],
                                d["broker_id"], d["epoch"]) for d in result["descriptors"]]))
    parts += ["", "cursors:", render_table(("subscription", "last_acked_offset"),
                                            sorted(result["cursors"].items()))]
    if result["lost_ranges"]:
        # Failovers: offsets a dead owner held durably but never archived (reassigned since).
        parts += ["", "lost ranges (failovers):", render_table(
            ("start", "end", "broker", "epoch", "exact", "quarantine"),
            [(r["start_offset"], "unknown" if r["end_offset"] is None and not r["exact"] else
              ("none" if r["end_offset"] is None else r["end_offset"]), r["broker_id"], r["epoch"],
              r["exact"], r["quarantine_path"] or "-") for r in result["lost_ranges"]])]
    return "\n".join(parts)


# -- verify -----------------------------------------------------------------------------

def _verify_args(p: argparse.ArgumentParser) -> None:
    _topic_arg(p)
    p.add_argument("--skip-objects", action="store_true", help="check descriptors only, do not read objects")
    p.add_argument("--allow-recorded-loss", action="store_true",
                   help="exit 0 although lost ranges are recorded (a known, accepted failover loss)")


def _verify(args: argparse.Namespace, settings: Settings, out: Output) -> int:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    report = ops.verify(settings, args.topic, progress=out.progress, check_objects=not args.skip_objects)
    out.emit(report.to_json(), render=lambda _r: render_verify(report))
    if not report.ok:
        return EXIT_PROBLEMS
    recorded_loss = any(p["kind"] == "lost_range" for p in report.problems)
    return EXIT_RECORDED_LOSS if recorded_loss and not args.allow_recorded_loss else 0


def _gc_args(p: argparse.ArgumentParser) -> None:
    _topic_arg(p)
    p.add_argument("--grace-s", type=float, default=3600.0,
                   help="only objects at least this old (default 3600): an upload may still be between "
                        "its PUT and its commit")


def _gc(args: argparse.Namespace, settings: Settings, out: Output) -> int:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    if not 0 <= args.grace_s < float("inf"):
        raise CliError("--grace-s must be a finite number >= 0")
    result = ops.gc(settings, args.topic, args.grace_s)
    out.emit(result, render=lambda r: "\n".join([f"deleted {k}" for k in r["deleted"]]
                                                  + [f"{len(r['deleted'])} orphan(s) deleted"]))
    return 0


def render_verify(report: Any) -> str:
    lines = [f"topic {report.topic}: {report.descriptors} descriptor(s), {report.objects_checked} object(s) read",
             f"archive offsets: {_range(report.archive_first_offset, report.archive_last_offset)}; "
             f"local WAL: {_range(report.wal_first_offset, report.wal_last_offset)}"]
    if report.ok and any(p["kind"] == "lost_range" for p in report.problems):
        lines.append("LOSS RECORDED: the archive is consistent, but acknowledged offsets listed below were "
                     "lost in a failover (exit 6; --allow-recorded-loss accepts them)")
    elif report.ok:
        lines.append("OK: offsets contiguous, every object intact, no unexplained garbage")
    else:
        lines.append(f"{sum(p['severity'] == 'error' for p in report.problems)} problem(s):")
    lines += [f"  {p['severity']} [{p['kind']}] {p['message']}" for p in report.problems]
    return "\n".join(lines)


def _range(first: int | None, last: int | None) -> str:
    return "none" if first is None else f"{first}-{last}"


# -- demo -------------------------------------------------------------------------------

def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and print its path")


def _demo(args: argparse.Namespace, settings: Settings, out: Output) -> int:
    from tiered.tools.demo import render_demo, run_demo  # deferred: keeps `dnb --help` light

    result = run_demo(metadata_url=_explicit(args, "metadata"), objects_url=_explicit(args, "objects"),
                      keep=args.keep)
    out.emit(result, render=render_demo)
    return 0 if result["ok"] else EXIT_PROBLEMS


# -- harness ----------------------------------------------------------------------------

def _harness_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=None, help="replay exactly one scenario with this seed")
    p.add_argument("--scenarios", type=_positive, default=20, help="number of scenarios (default 20)")
    p.add_argument("--first-seed", type=int, default=0, help="seed of the first scenario (default 0)")
    p.add_argument("--brokers", type=_positive, default=3, help="brokers per scenario (default 3)")
    p.add_argument("--steps", type=_positive, default=12, help="schedule steps per scenario (default 12)")
    p.add_argument("--subprocess-crashes", action="store_true",
                   help="also SIGKILL real broker subprocesses (slower)")
    p.add_argument("--time-limit-s", type=float, default=None, help="stop starting scenarios after this long")


def _harness(args: argparse.Namespace, settings: Settings, out: Output) -> int:
    from tiered.tools.harness import render_summary, run_many  # deferred: keeps `dnb --help` light

    if not out.debug:
        # The harness injects faults on purpose; the library's warnings about them are noise.
        logging.getLogger().setLevel(logging.ERROR)
    summary = run_many(first_seed=args.seed if args.seed is not None else args.first_seed,
                       scenarios=1 if args.seed is not None else args.scenarios,
                       brokers=args.brokers, steps=args.steps,
                       metadata_url=_explicit(args, "metadata"), objects_url=_explicit(args, "objects"),
                       subprocess_crashes=args.subprocess_crashes, time_limit_s=args.time_limit_s,
                       progress=out.progress)
    out.emit(summary, render=render_summary)
    return 0 if summary["failed"] == 0 else EXIT_PROBLEMS


def _explicit(args: argparse.Namespace, name: str) -> str | None:
    """Only URLs the user gave (flag or env) redirect the demo/harness to real servers."""
    return getattr(args, name, None)


# -- query ------------------------------------------------------------------------------

def _query_args(p: argparse.ArgumentParser) -> None:
    _topic_arg(p)
    p.add_argument("sql", help="Spark SQL over the topic's archived messages, table name `messages`")


def _query(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    result = ops.query(settings, args.topic, args.sql)
    out.emit(result, render=lambda r: render_table(r["columns"], r["rows"]) + f"\n{len(r['rows'])} row(s)")


# -- broker / move ----------------------------------------------------------------------

def _broker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["run"], help="run: serve until SIGTERM (then seal every topic)")
    p.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help="where to serve HTTP (keys server.listen_host/listen_port, default 127.0.0.1:8080)")
    p.add_argument("--advertise", default=None, metavar="URL",
                   help="URL clients reach this broker at (key broker.advertised_address, default "
                        "http://<listen>)")
    p.add_argument("--shutdown-timeout-s", type=float, default=None,
                   help="after SIGTERM, abandon topics not sealed by then (key server.shutdown_timeout_s, "
                        "default 120)")
    p.add_argument("--load-manager", action="store_true",
                   help="also run a load-manager candidate (leader election; the leader places and moves "
                        "topics), configured by the [load_manager] section or --load-manager-config")
    p.add_argument("--load-manager-config", default=None, metavar="FILE",
                   help="JSON file: the seed's load_manager section, plus optional leader_ttl_s / "
                        "poll_interval_s (instead of the config file's [load_manager] section)")
    p.add_argument("--load-report-interval-s", type=float, default=None,
                   help="write this broker's load report this often (default: the load-manager config's, 30)")


def config_flags(args: argparse.Namespace) -> dict[str, tuple[Any, str]]:
    """Config keys set by a command's own options (``broker run --listen …``)."""
    flags: dict[str, tuple[Any, str]] = {}
    if getattr(args, "listen", None) is not None:
        host, _, port = args.listen.rpartition(":")
        if not host or not port.isdigit():
            raise CliError(f"--listen {args.listen!r}: use HOST:PORT")
        flags["server.listen_host"] = (host, "--listen")
        flags["server.listen_port"] = (int(port), "--listen")
    if getattr(args, "advertise", None) is not None:
        flags["broker.advertised_address"] = (args.advertise, "--advertise")
    if getattr(args, "shutdown_timeout_s", None) is not None:
        flags["server.shutdown_timeout_s"] = (args.shutdown_timeout_s, "--shutdown-timeout-s")
    return flags


def _broker(args: argparse.Namespace, settings: Settings, out: Output) -> int:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    return ops.run_broker(settings, args.load_manager, args.load_manager_config, args.load_report_interval_s)


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["show"], help="show: every key's effective value and where it came from")


def _config(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.config.loader import LoadedConfig  # deferred: keeps `dnb --help` light
    from tiered.config.schema import keys  # deferred: keeps `dnb --help` light

    loaded = settings.loaded
    assert isinstance(loaded, LoadedConfig)
    derived = {"wal_dir": settings.wal_dir, "metadata": settings.metadata_url, "objects": settings.objects_url}
    rows = []
    for key, value, source in loaded.rows():
        if value is None and key in derived:  # show what "unset" resolves to
            value, source = derived[key], f"{source} (from data_dir)"
        rows.append({"key": key, "value": _plain(value), "source": source})
    result = {"file": loaded.file, "keys": rows}
    assert len(rows) == len(keys())
    out.emit(result, render=lambda r: render_table(("key", "value", "source"),
                                                   [(k["key"], _shown(k["value"]), k["source"]) for k in r["keys"]])
             + (f"\nconfig file: {r['file']}" if r["file"] else "\nno config file (--config FILE or DNB_CONFIG)"))


def _plain(value: Any) -> Any:
    """A config value as JSON: enums by value, tuples as lists, URLs without credentials."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, str) and "://" in value:
        return redact_url(value)
    return value


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _move_args(p: argparse.ArgumentParser) -> None:
    _topic_arg(p)
    p.add_argument("--to", required=True, help="broker id that should host the topic next")
    p.add_argument("--timeout-s", type=float, default=120.0, help="bound on waiting for the seal")


def _move(args: argparse.Namespace, settings: Settings, out: Output) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    out.emit(ops.move(settings, args.topic, args.to, args.timeout_s))


def _cluster_args(p: argparse.ArgumentParser) -> None:
    from tiered.tools.cli import cluster_cmd  # deferred: keeps `dnb --help` light

    cluster_cmd.add_arguments(p)


def _cluster(args: argparse.Namespace, settings: Settings, out: Output) -> int | None:
    from tiered.tools.cli import cluster_cmd  # deferred: keeps `dnb --help` light

    return cluster_cmd.run(args, settings, out)


# -- argument types ---------------------------------------------------------------------

#: Upper bound of count-like options: far beyond any demo or load run, and a typo such as
#: 100000000000000000000000 fails at once instead of running for ever.
COUNT_MAX = 10**12


def _non_negative(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{raw} is negative")
    if value > COUNT_MAX:
        raise argparse.ArgumentTypeError(f"{raw} is above the limit {COUNT_MAX}")
    return value


def _positive(raw: str) -> int:
    value = _non_negative(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{raw} must be > 0")
    return value


COMMANDS: tuple[Command, ...] = (
    Command("produce", "append messages (loads/restores the topic on this broker if needed)",
            _produce_args, _produce),
    Command("upload", "run one upload pass now", _topic_arg, _upload),
    Command("consume", "read through the tiered reader (cloud, then WAL, then live)", _consume_args, _consume),
    Command("seal", "unload the topic from this broker: drain, seal, release, delete the local WAL",
            _topic_arg, _seal),
    Command("restore", "load the topic on this broker from its sealed state", _restore_args, _restore),
    Command("inspect", "owner, epoch, sealed state, descriptors, cursors, local WAL range", _topic_arg, _inspect),
    Command("verify", "scrub the topic: contiguity, object CRCs, sealed state, local WAL, orphans",
            _verify_args, _verify),
    Command("gc", "delete orphan objects (named by no descriptor, inside the archived range)", _gc_args, _gc),
    Command("demo", "replay the seed scenario (a topic moves from broker A to B) and print the timeline",
            _demo_args, _demo),
    Command("harness", "randomized offset-continuity checker (moves, crashes, faults)", _harness_args, _harness),
    Command("query", "run Spark SQL over the topic's archive", _query_args, _query),
    Command("broker", "run a long-lived broker: HTTP API, follows its assignments, seals on SIGTERM",
            _broker_args, _broker),
    Command("config", "show the effective configuration: every key, its value and where it came from",
            _config_args, _config),
    Command("move", "move a topic to another broker: unload (seal) where it is, then assign it",
            _move_args, _move),
    Command("cluster", "load manager: brokers, leader, balance, moves, history, assign/move, drain/undrain, "
                       "pause/resume, rebalance --dry-run", _cluster_args, _cluster),
)
