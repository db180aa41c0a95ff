"""The ``dnb`` command line: a thin shell over library functions.

Global options come before the command. Every setting is a key of
:class:`tiered.config.DnbConfig`, taken from flags, then ``DNB_…`` variables, then the
``--config`` TOML file, then defaults (docs/CONFIG.md), so a shell can pin a broker
identity once (``export DNB_BROKER_ID=2``). Every command only
parses its arguments, calls one library function and prints the result through
:mod:`tiered.tools.cli.output`; the logic lives in ``tiered`` where tests call it directly.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from tiered.tools.cli import commands
from tiered.tools.cli.output import EXIT_USAGE, Output, run_command
from tiered.tools.cli.settings import Settings

PROG = "dnb"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="dnb-storage: reliable topics across brokers (WAL, archive, seal/restore).",
        epilog="Run `dnb demo` to see a topic move between two brokers end to end.",
    )
    _add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for spec in commands.COMMANDS:
        command_parser = sub.add_parser(spec.name, help=spec.help, description=spec.help)
        spec.add_arguments(command_parser)
        command_parser.set_defaults(handler=spec.run)
    return parser


def _add_global_options(parser: argparse.ArgumentParser) -> None:
    # Defaults are None so the loader can tell a flag from a value that came from the
    # config file or a DNB_ variable (precedence: flags > env > file > defaults).
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML config file (env DNB_CONFIG); keys and defaults: docs/CONFIG.md")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="set any config key, e.g. --set uploader.interval_s=5 (repeatable; "
                             "beats env and file)")
    parser.add_argument("--data-dir", default=None,
                        help="broker data directory (key data_dir, env DNB_DATA_DIR, default ./dnb-data)")
    parser.add_argument("--wal-dir", default=None,
                        help="WAL directory (key wal_dir, env DNB_WAL_DIR, default <data-dir>/wal)")
    parser.add_argument("--metadata", default=None,
                        help="metadata store URL: sqlite:///path or etcd://host:port[,host:port][/root] "
                             "(key metadata, env DNB_METADATA, default sqlite:///<data-dir>/metadata.db)")
    parser.add_argument("--objects", default=None,
                        help="object store URL: file:///dir or s3://bucket/prefix "
                             "(key objects, env DNB_OBJECTS, default file://<data-dir>/objects)")
    parser.add_argument("--broker-id", default=None,
                        help="this broker's id (key broker_id, env DNB_BROKER_ID, default 1)")
    parser.add_argument("--json", action="store_true", default=_env_flag("DNB_JSON"),
                        help="print exactly one JSON object on stdout (env DNB_JSON=1)")
    parser.add_argument("--debug", action="store_true", default=_env_flag("DNB_DEBUG"),
                        help="show tracebacks and library logs on errors (env DNB_DEBUG=1)")


#: Global flags that set a config key: argparse dest -> (key, flag).
_KEY_FLAGS = {"data_dir": ("data_dir", "--data-dir"), "wal_dir": ("wal_dir", "--wal-dir"),
              "metadata": ("metadata", "--metadata"), "objects": ("objects", "--objects"),
              "broker_id": ("broker_id", "--broker-id")}


def config_flags(args: argparse.Namespace) -> dict[str, tuple[object, str]]:
    """The config keys set on the command line: ``--set`` first, then the named flags
    (a named flag given together with ``--set`` of the same key wins)."""
    from tiered.config.loader import parse_assignment  # deferred: keeps `dnb --help` light

    flags: dict[str, tuple[object, str]] = {}
    for text in args.settings:
        key, value = parse_assignment(text)
        flags[key] = (value, f"--set {key}")
    for dest, (key, flag) in _KEY_FLAGS.items():
        if getattr(args, dest, None) is not None:
            flags[key] = (getattr(args, dest), flag)
    flags.update(commands.config_flags(args))
    return flags


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dnb``; returns the process exit code (never calls sys.exit)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse exits on --help and on usage errors
        return int(stop.code or 0) if stop.code in (0, None) else EXIT_USAGE
    out = Output(json_mode=args.json, debug=args.debug)
    _configure_logging(args.debug)

    def body() -> int | None:
        from tiered.config import load_config  # deferred: keeps `dnb --help` light

        loaded = load_config(args.config, os.environ, config_flags(args))
        settings = Settings.from_config(loaded)
        return args.handler(args, settings, out)

    return run_command(out, body)


def _configure_logging(debug: bool) -> None:
    # Library warnings (e.g. an unarchived tail after a takeover) are useful to an
    # operator even without --debug; INFO chatter is not.
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="dnb: %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


if __name__ == "__main__":
    sys.exit(main())
