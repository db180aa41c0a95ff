"""The ``dnb`` command line: a thin shell over library functions.

Every setting is a key of :class:`tiered.config.DnbConfig`, taken from flags, then
``DNB_…`` variables, then the ``--config`` TOML file, then defaults (docs/CONFIG.md), so a
shell can pin a broker identity once (``export DNB_BROKER_ID=2``). The command tree is
click (:mod:`tiered.tools.cli.commands`); every command only parses its arguments, calls
one library function and prints the result through :mod:`tiered.tools.cli.output`; the
logic lives in ``tiered`` where tests call it directly. This module runs one invocation:
logging for a short command, and every failure (a usage error included) mapped onto an
exit code and, with ``--json``, a JSON error object.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from tiered.tools.cli.app import DEFAULT_LOG_LEVEL, Invocation
from tiered.tools.cli.commands import cli
from tiered.tools.cli.output import Output, run_command

PROG = "dnb"
#: The same log line is shown at most this often per REPEAT_WINDOW_S.
REPEATS_SHOWN = 3
REPEAT_WINDOW_S = 60.0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``dnb``; returns the process exit code (never calls sys.exit)."""
    args = list(sys.argv[1:] if argv is None else argv)
    # Until the options are parsed, a usage error is JSON when --json is anywhere on the line.
    out = Output(json_mode="--json" in args or _env_flag("DNB_JSON"), debug=_env_flag("DNB_DEBUG"))
    invocation = Invocation(out)

    def body() -> int | None:
        invocation.given.clear()
        with _cli_logging(invocation):
            return cli.main(args, prog_name=PROG, obj=invocation, standalone_mode=False)

    return run_command(out, body)


@contextmanager
def _cli_logging(invocation: Invocation) -> Iterator[None]:
    """Library logs on stderr for the length of one command, at ERROR until the command
    sets its level (:meth:`Invocation.apply`: INFO with ``-v``, DEBUG with ``-vv`` or
    ``--debug``); repeats of one line are cut after :data:`REPEATS_SHOWN` a minute. Restored
    afterwards: ``main`` may run in-process (tests, embedding)."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dnb: %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_RepeatFilter(REPEATS_SHOWN, REPEAT_WINDOW_S))
    old_level = root.level
    handler.setLevel(DEFAULT_LOG_LEVEL)
    invocation.log_handler = handler
    root.addHandler(handler)
    root.setLevel(DEFAULT_LOG_LEVEL)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # the process is ours: grpc's C core stays quiet
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


class _RepeatFilter(logging.Filter):
    """Pass at most ``limit`` identical lines (logger, level, text) per ``window_s``: a
    retry loop says what is wrong a few times, not once per attempt, and a long-lived
    ``dnb broker run`` still logs a line that comes back hours later."""

    def __init__(self, limit: int, window_s: float) -> None:
        super().__init__()
        self.limit, self.window_s = limit, window_s
        self.seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        started, count = self.seen.get(key, (record.created, 0))
        if record.created - started >= self.window_s:
            started, count = record.created, 0
        if len(self.seen) > 10_000:  # a bounded memory for a process that runs for weeks
            self.seen.clear()
        self.seen[key] = (started, count + 1)
        return count < self.limit


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


if __name__ == "__main__":
    sys.exit(main())
