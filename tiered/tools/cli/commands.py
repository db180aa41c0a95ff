"""One click command per ``dnb`` command: its options, one library call, one result.

Each command takes the :class:`Invocation` (output + global options), resolves its
:class:`Settings`, calls a function of :mod:`tiered.tools.cli.ops` (or the library) and
hands the result to :class:`Output`; it returns an exit code (None for success). The
JSON keys printed here are the CLI's contract (docs/CLI.md) and are pinned by tests/cli.
The library is imported inside each command, so ``dnb --help`` loads click only.
"""
from __future__ import annotations

import base64
import enum
import logging
import math
import sys
from typing import Any

import click

from tiered.tools.cli.app import DnbGroup, Invocation, pass_invocation
from tiered.tools.cli.cluster_cmd import cluster
from tiered.tools.cli.output import (EXIT_CODES_HELP, EXIT_PROBLEMS, EXIT_RECORDED_LOSS, CliError, render_mapping,
                                     render_table)
from tiered.tools.cli.settings import redact_url

#: Upper bound of count-like options: far beyond any demo or load run, and a typo such as
#: 100000000000000000000000 fails at once instead of running for ever.
COUNT_MAX = 10**12


class TopicName(click.ParamType):
    """The canonical ``/namespace/topic`` form only: an operator typing ``ns/t`` most
    likely meant something else, and a typo must not create or move a topic."""

    name = "TOPIC"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from wal.errors import InvalidTopicName  # deferred: keeps `dnb --help` light
        from wal.topics import TopicName as Parsed  # deferred: keeps `dnb --help` light

        if not str(value).startswith("/"):
            self.fail(f"topic name {value!r} must start with '/' (/namespace/topic)", param, ctx)
        try:
            return str(Parsed.parse(value))
        except InvalidTopicName as e:
            self.fail(str(e), param, ctx)


class Count(click.ParamType):
    """A whole number in [minimum, COUNT_MAX]."""

    name = "N"

    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            number = value
        else:
            try:
                number = int(value)
            except ValueError:
                self.fail(f"{value!r} is not a whole number", param, ctx)
        if number < 0:
            self.fail(f"{value} is negative", param, ctx)
        if number < self.minimum:
            self.fail(f"{value} must be >= {self.minimum}", param, ctx)
        if number > COUNT_MAX:
            self.fail(f"{value} is above the limit {COUNT_MAX}", param, ctx)
        return number


class Seconds(click.ParamType):
    """A finite, non-negative number of seconds (``nan`` would never expire, ``inf`` never end)."""

    name = "SECONDS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value} is not a finite, non-negative number of seconds", param, ctx)
        return number


TOPIC = TopicName()
topic_argument = click.argument("topic", type=TOPIC)
broker_url_option = click.option(
    "--broker", "broker_url", envvar="DNB_BROKER_URL", metavar="URL",
    help="talk to a running `dnb broker` (any one: it redirects to the owner) instead of hosting the topic "
         "in this process (env DNB_BROKER_URL)")


def _epilog(text: str) -> str:
    r"""``text`` kept as written in ``--help`` (click rewraps paragraphs not marked ``\b``)."""
    return "\n\n".join("\b\n" + paragraph for paragraph in text.split("\n\n"))


@click.group(cls=DnbGroup, root=True, epilog=_epilog(
    "Run `dnb demo` to see a topic move between two brokers end to end.\n\n" + EXIT_CODES_HELP))
@click.version_option(package_name="dnb-storage", prog_name="dnb", message="%(prog)s %(version)s")
def cli() -> None:
    """dnb-storage: reliable topics across brokers (WAL, archive, seal/restore).

    Every setting is a config key (docs/CONFIG.md): flags > DNB_… env > --config file >
    defaults. Global options may come before or after the command.
    """


# -- produce / upload -------------------------------------------------------------------

@cli.command("produce", help="append messages (loads/restores the topic on this broker if needed)")
@topic_argument
@click.option("--count", type=Count(), default=None,
              help="append N generated messages (default: one message per stdin line)")
@click.option("--size", type=Count(), default=None,
              help="payload size in bytes of generated messages (default: 'message-<i>')")
@click.option("--key", default=None, help="message key for every message")
@click.option("--ack", type=click.Choice(["durable", "archived"]), default="durable", show_default=True,
              help="wait until fsynced locally or inside a committed object")
@broker_url_option
@pass_invocation
def produce(inv: Invocation, topic: str, count: int | None, size: int | None, key: str | None, ack: str,
            broker_url: str | None) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    settings = inv.settings()
    largest = settings.config.wal.max_message_bytes
    if size is not None and size > largest:
        # Refused before a payload is made (a huge --size would allocate it first).
        raise click.BadParameter(f"{size} is larger than a message may be (wal.max_message_bytes = {largest})",
                                 param_hint="--size")
    payloads = ops.generated_payloads(count, size) if count is not None else ops.stdin_payloads(sys.stdin)
    payloads = inv.out.progress(payloads, count, "produce")
    key_bytes = key.encode() if key is not None else None
    if broker_url:
        first, last = ops.produce_remote(broker_url, topic, payloads, key=key_bytes, ack=ack)
    else:
        first, last = ops.produce(settings, topic, payloads, key=key_bytes, ack=ack)
    inv.out.emit({"first_offset": first, "last_offset": last})


@cli.command("upload", help="run one upload pass now")
@topic_argument
@pass_invocation
def upload(inv: Invocation, topic: str) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    inv.out.emit({"committed_through": ops.upload(inv.settings(), topic)})


# -- consume ----------------------------------------------------------------------------

@cli.command("consume", help="read through the tiered reader (cloud, then WAL, then live)")
@topic_argument
@click.option("--subscription", required=True, help="subscription name (its cursor lives in metadata)")
@click.option("--from", "start", default=None, metavar="earliest|latest|OFFSET",
              help="where to start; default: the cursor + 1, else earliest")
@click.option("--max", "max_messages", type=Count(), default=None, help="stop after N messages")
@click.option("--ack", is_flag=True, help="acknowledge what was read and flush the cursor")
@click.option("--follow", is_flag=True, help="keep waiting for new messages (Ctrl-C stops)")
@click.option("--idle-timeout-s", type=Seconds(), default=None,
              help="with --follow, stop after this long without a message")
@broker_url_option
@pass_invocation
def consume(inv: Invocation, topic: str, subscription: str, start: str | None, max_messages: int | None, ack: bool,
            follow: bool, idle_timeout_s: float | None, broker_url: str | None) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    settings = inv.settings()
    begin = _parse_start(start)
    if broker_url:
        if follow or not (begin is None or isinstance(begin, int) or begin == "earliest"):
            raise CliError("with --broker, --from takes earliest or an offset (no latest, no --follow)")
        messages = ops.consume_remote(broker_url, topic, subscription, begin, max_messages=max_messages, ack=ack)
    else:
        messages = ops.consume(settings, topic, subscription, start=begin, max_messages=max_messages, ack=ack,
                               follow=follow, idle_timeout_s=idle_timeout_s)
    inv.out.emit({"messages": [message_json(m) for m in messages]}, render=_render_messages)


@cli.command("unsubscribe", help="delete a subscription: its cursor is gone (the name, used again, starts afresh)")
@topic_argument
@click.option("--subscription", required=True, help="subscription name")
@broker_url_option
@pass_invocation
def unsubscribe(inv: Invocation, topic: str, subscription: str, broker_url: str | None) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    if broker_url:
        deleted = ops.unsubscribe_remote(broker_url, topic, subscription)
    else:
        deleted = ops.unsubscribe(inv.settings(), topic, subscription)
    inv.out.emit({"subscription": subscription, "deleted": deleted})


# -- seal / restore ---------------------------------------------------------------------

@cli.command("seal", help="unload the topic from this broker: drain, seal, release, delete the local WAL")
@topic_argument
@pass_invocation
def seal(inv: Invocation, topic: str) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    inv.out.emit({"last_committed_offset": ops.seal(inv.settings(), topic, tracker=inv.out.tracker)})


@cli.command("restore", help="load the topic on this broker from its sealed state")
@topic_argument
@click.option("--takeover", is_flag=True, help="take the topic from a broker that died without sealing (failover)")
@click.option("--discard-local-wal", is_flag=True,
              help="this broker's local WAL of the topic does not open: quarantine it, record the offsets it may "
                   "have held as lost, and continue after the archive")
@pass_invocation
def restore(inv: Invocation, topic: str, takeover: bool, discard_local_wal: bool) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    inv.out.emit({"next_offset": ops.restore(inv.settings(), topic, takeover=takeover,
                                             discard_local_wal=discard_local_wal)})


# -- topic create / delete / list ---------------------------------------------------------

@cli.group("topic", help="create, delete and list topics")
def topic_group() -> None:
    pass


@topic_group.command("create", help="create the topic on this broker (the only way back for a deleted name)")
@topic_argument
@pass_invocation
def topic_create(inv: Invocation, topic: str) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    inv.out.emit(ops.topic_create(inv.settings(), topic))


@topic_group.command("delete", help="delete the topic: records, cursors, descriptors, objects (idempotent; "
                                    "re-run finishes an interrupted delete)")
@topic_argument
@pass_invocation
def topic_delete(inv: Invocation, topic: str) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    inv.out.emit(ops.topic_delete(inv.settings(), topic, tracker=inv.out.tracker))


@topic_group.command("list", help="every topic: status (owned/sealed/deleting), offsets, archived bytes")
@click.option("--deleted", "include_deleted", is_flag=True, help="also list deleted names (their tombstones)")
@pass_invocation
def topic_list(inv: Invocation, include_deleted: bool) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    inv.out.emit({"topics": ops.topic_list(inv.settings(), include_deleted)}, render=_render_topics)


def _render_topics(result: dict[str, Any]) -> str:
    return render_table(("topic", "status", "owner", "epoch", "first", "last", "objects", "bytes"),
                        [(t["topic"], t["status"], t["owner"], t["epoch"], t["first_offset"], t["last_offset"],
                          t["archived_objects"], t["archived_bytes"]) for t in result["topics"]])


# -- inspect / verify / gc --------------------------------------------------------------

@cli.command("inspect", help="owner, epoch, sealed state, descriptors, cursors, local WAL range")
@topic_argument
@pass_invocation
def inspect(inv: Invocation, topic: str) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    inv.out.emit(ops.inspect(inv.settings(), topic), render=_render_inspect)


@cli.command("verify", help="scrub the topic: contiguity, object CRCs, sealed state, local WAL, orphans")
@topic_argument
@click.option("--skip-objects", is_flag=True, help="check descriptors only, do not read objects")
@click.option("--allow-recorded-loss", is_flag=True,
              help="exit 0 although lost ranges are recorded (a known, accepted failover loss)")
@pass_invocation
def verify(inv: Invocation, topic: str, skip_objects: bool, allow_recorded_loss: bool) -> int:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    report = ops.verify(inv.settings(), topic, progress=inv.out.progress, check_objects=not skip_objects)
    inv.out.emit(report.to_json(), render=lambda _r: render_verify(report))
    if not report.ok:
        return EXIT_PROBLEMS
    recorded_loss = any(p["kind"] == "lost_range" for p in report.problems)
    return EXIT_RECORDED_LOSS if recorded_loss and not allow_recorded_loss else 0


@cli.command("gc", help="delete orphan objects (named by no descriptor, inside the archived range)")
@topic_argument
@click.option("--grace-s", type=click.FloatRange(0, float("inf"), max_open=True), default=3600.0,
              show_default=True,
              help="only objects at least this old: an upload may still be between its PUT and its commit")
@pass_invocation
def gc(inv: Invocation, topic: str, grace_s: float) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    result = ops.gc(inv.settings(), topic, grace_s)
    inv.out.emit(result, render=lambda r: "\n".join([f"deleted {k}" for k in r["deleted"]]
                                                      + [f"{len(r['deleted'])} orphan(s) deleted"]))


# -- demo / harness ---------------------------------------------------------------------

@cli.command("demo", help="replay the seed scenario (a topic moves from broker A to B) and print the timeline")
@click.option("--keep", is_flag=True, help="keep the temporary directory and print its path")
@pass_invocation
def demo(inv: Invocation, keep: bool) -> int:
    from tiered.tools.demo import render_demo, run_demo  # deferred: keeps `dnb --help` light

    # Only URLs the user gave (flag or env) send the demo to real servers.
    result = run_demo(metadata_url=inv.option("metadata"), objects_url=inv.option("objects"), keep=keep)
    inv.out.emit(result, render=render_demo)
    return 0 if result["ok"] else EXIT_PROBLEMS


@cli.command("harness", help="randomized offset-continuity checker (moves, crashes, faults)")
@click.option("--seed", type=int, default=None, help="replay exactly one scenario with this seed")
@click.option("--scenarios", type=Count(1), default=20, show_default=True, help="number of scenarios")
@click.option("--first-seed", type=int, default=0, show_default=True, help="seed of the first scenario")
@click.option("--brokers", type=Count(1), default=3, show_default=True, help="brokers per scenario")
@click.option("--steps", type=Count(1), default=12, show_default=True, help="schedule steps per scenario")
@click.option("--subprocess-crashes", is_flag=True, help="also SIGKILL real broker subprocesses (slower)")
@click.option("--time-limit-s", type=float, default=None, help="stop starting scenarios after this long")
@pass_invocation
def harness(inv: Invocation, seed: int | None, scenarios: int, first_seed: int, brokers: int, steps: int,
            subprocess_crashes: bool, time_limit_s: float | None) -> int:
    from tiered.tools.harness import render_summary, run_many  # deferred: keeps `dnb --help` light

    if not inv.out.debug:
        # The harness injects faults on purpose; the library's warnings about them are noise.
        logging.getLogger().setLevel(logging.ERROR)
    summary = run_many(first_seed=seed if seed is not None else first_seed,
                       scenarios=1 if seed is not None else scenarios, brokers=brokers, steps=steps,
                       metadata_url=inv.option("metadata"), objects_url=inv.option("objects"),
                       subprocess_crashes=subprocess_crashes, time_limit_s=time_limit_s,
                       progress=inv.out.progress)
    inv.out.emit(summary, render=render_summary)
    return 0 if summary["failed"] == 0 else EXIT_PROBLEMS


# -- query ------------------------------------------------------------------------------

@cli.command("query", help="run Spark SQL over the topic's archive (table `messages`; needs the spark extra)")
@topic_argument
@click.argument("sql")
@pass_invocation
def query(inv: Invocation, topic: str, sql: str) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    result = ops.query(inv.settings(), topic, sql)
    inv.out.emit(result, render=lambda r: render_table(r["columns"], r["rows"]) + f"\n{len(r['rows'])} row(s)")


# -- broker / config / move -------------------------------------------------------------

@cli.group("broker", help="run a long-lived broker: HTTP API, follows its assignments, seals on SIGTERM")
def broker() -> None:
    pass


@broker.command("run", help="serve until SIGTERM (then seal every topic)")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="where to serve HTTP (keys server.listen_host/listen_port, default 127.0.0.1:8080)")
@click.option("--advertise", default=None, metavar="URL",
              help="URL clients reach this broker at (key broker.advertised_address, default http://<listen>)")
@click.option("--shutdown-timeout-s", type=float, default=None,
              help="after SIGTERM, abandon topics not sealed by then (key server.shutdown_timeout_s, default 120)")
@click.option("--load-manager", is_flag=True,
              help="also run a load-manager candidate (leader election; the leader places and moves topics), "
                   "configured by the [load_manager] section or --load-manager-config")
@click.option("--load-manager-config", default=None, metavar="FILE",
              help="JSON file: the seed's load_manager section, plus optional leader_ttl_s / poll_interval_s "
                   "(instead of the config file's [load_manager] section)")
@click.option("--load-report-interval-s", type=float, default=None,
              help="write this broker's load report this often (default: the load-manager config's, 30)")
@pass_invocation
def broker_run(inv: Invocation, listen: str | None, advertise: str | None, shutdown_timeout_s: float | None,
               load_manager: bool, load_manager_config: str | None, load_report_interval_s: float | None) -> int:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    flags: dict[str, tuple[Any, str]] = {}
    if listen is not None:
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit():
            raise CliError(f"--listen {listen!r}: use HOST:PORT")
        flags["server.listen_host"] = (host, "--listen")
        flags["server.listen_port"] = (int(port), "--listen")
    if advertise is not None:
        flags["broker.advertised_address"] = (advertise, "--advertise")
    if shutdown_timeout_s is not None:
        flags["server.shutdown_timeout_s"] = (shutdown_timeout_s, "--shutdown-timeout-s")
    inv.long_lived()
    return ops.run_broker(inv.settings(flags), load_manager, load_manager_config, load_report_interval_s)


@cli.group("config", help="show the effective configuration: every key, its value and where it came from")
def config() -> None:
    pass


@config.command("show", help="every key's effective value and where it came from")
@pass_invocation
def config_show(inv: Invocation) -> None:
    from tiered.config.loader import LoadedConfig  # deferred: keeps `dnb --help` light
    from tiered.config.schema import keys  # deferred: keeps `dnb --help` light

    settings = inv.settings()
    loaded = settings.loaded
    assert isinstance(loaded, LoadedConfig)
    derived = {"wal_dir": settings.wal_dir, "metadata": settings.metadata_url, "objects": settings.objects_url}
    rows = []
    for key, value, source in loaded.rows():
        if value is None and key in derived:  # show what "unset" resolves to
            value, source = derived[key], f"{source} (from data_dir)"
        rows.append({"key": key, "value": _plain(value), "source": source})
    assert len(rows) == len(keys())
    inv.out.emit({"file": loaded.file, "keys": rows}, render=lambda r: render_table(
        ("key", "value", "source"), [(k["key"], _shown(k["value"]), k["source"]) for k in r["keys"]])
        + (f"\nconfig file: {r['file']}" if r["file"] else "\nno config file (--config FILE or DNB_CONFIG)"))


@cli.command("move", help="move a topic to another broker: unload (seal) where it is, then assign it")
@topic_argument
@click.option("--to", "to_broker", required=True, help="broker id that should host the topic next")
@click.option("--timeout-s", type=float, default=120.0, show_default=True, help="bound on waiting for the seal")
@pass_invocation
def move(inv: Invocation, topic: str, to_broker: str, timeout_s: float) -> None:
    from tiered.tools.cli import ops  # deferred: keeps `dnb --help` light

    inv.out.emit(ops.move(inv.settings(), topic, to_broker, timeout_s))


# -- rendering --------------------------------------------------------------------------

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


cli.add_command(cluster)
