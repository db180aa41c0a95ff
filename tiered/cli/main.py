"""The ``dnb`` command line: a thin shell over library functions.

Global options come before the command and each has an environment variable, so a
shell can pin a broker identity once (``export DNB_BROKER_ID=2``). Every command only
parses its arguments, calls one library function and prints the result through
:mod:`tiered.cli.output`; the logic lives in ``tiered`` where tests call it directly.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tiered.cli import commands
from tiered.cli.output import EXIT_USAGE, Output, run_command
from tiered.cli.settings import Settings

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
    env = os.environ.get
    parser.add_argument("--data-dir", default=env("DNB_DATA_DIR", "./dnb-data"),
                        help="broker data directory (env DNB_DATA_DIR, default ./dnb-data)")
    parser.add_argument("--wal-dir", default=env("DNB_WAL_DIR"),
                        help="WAL directory (env DNB_WAL_DIR, default <data-dir>/wal)")
    parser.add_argument("--metadata", default=env("DNB_METADATA"),
                        help="metadata store URL: sqlite:///path or etcd://host:port[,host:port][/root] "
                             "(env DNB_METADATA, default sqlite:///<data-dir>/metadata.db)")
    parser.add_argument("--objects", default=env("DNB_OBJECTS"),
                        help="object store URL: file:///dir or s3://bucket/prefix "
                             "(env DNB_OBJECTS, default file://<data-dir>/objects)")
    parser.add_argument("--broker-id", default=env("DNB_BROKER_ID", "1"),
                        help="this broker's id (env DNB_BROKER_ID, default 1)")
    parser.add_argument("--json", action="store_true", default=_env_flag("DNB_JSON"),
                        help="print exactly one JSON object on stdout (env DNB_JSON=1)")
    parser.add_argument("--debug", action="store_true", default=_env_flag("DNB_DEBUG"),
                        help="show tracebacks and library logs on errors (env DNB_DEBUG=1)")


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
        settings = Settings.from_args(args)
        return args.handler(args, settings, out)

    return run_command(out, body)


def _configure_logging(debug: bool) -> None:
    import logging

    # Library warnings (e.g. an unarchived tail after a takeover) are useful to an
    # operator even without --debug; INFO chatter is not.
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING,
                        format="dnb: %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


if __name__ == "__main__":
    sys.exit(main())
