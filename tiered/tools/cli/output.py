"""How the ``dnb`` commands print: one JSON object (``--json``) or a readable table.

Commands never print directly; they build a result dict and hand it to :class:`Output`.
Errors from the library are turned into one clear line on stderr and a non-zero exit
by :func:`run_command`, so every command fails the same way. A traceback appears only
with ``--debug``, because operators need the message, developers need the stack.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from tiered.errors import MalformedRecord, StorageError, StorageUnavailable
from typing import Any, TextIO, TypeVar

from native.errors import DnbError

T = TypeVar("T")

#: Exit codes: 0 ok, 1 the command ran but found a problem (verify not ok, harness
#: failure), 2 bad usage or input, 3 refused because the state was not as expected
#: (owned elsewhere, fenced, locked by another process, topic full), 4 a storage backend
#: is unavailable, 5 the stored data is damaged or inconsistent (corrupt object or WAL,
#: a gap, a broken descriptor chain, a malformed metadata record), 70 an unexpected
#: internal error. With ``--json`` every error is also one JSON object on stdout:
#: ``{"error": {"type": ..., "message": ..., "exit_code": ...}}``.
EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_UNAVAILABLE = 4
EXIT_DATA = 5
#: verify: the archive is consistent, but acknowledged messages are recorded lost (a
#: failover took over a dead owner's unarchived tail); --allow-recorded-loss makes it 0.
EXIT_RECORDED_LOSS = 6
EXIT_INTERNAL = 70


class CliError(DnbError):
    """An error the CLI itself raises with a ready-to-print message and exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Output:
    """Where results, tables and progress go for one invocation."""

    json_mode: bool = False
    debug: bool = False
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)

    def emit(self, result: dict[str, Any], render: Callable[[dict[str, Any]], str] | None = None) -> None:
        """Print the command's result: exactly one JSON object, or the human rendering."""
        if self.json_mode:
            self.stdout.write(json.dumps(result, sort_keys=False, default=_json_default) + "\n")
        else:
            text = render(result) if render is not None else render_mapping(result)
            self.stdout.write(text.rstrip("\n") + "\n")
        self.stdout.flush()

    def note(self, message: str) -> None:
        """A human hint on stderr (never in --json mode, which must stay machine-clean)."""
        if not self.json_mode:
            self.stderr.write(message.rstrip("\n") + "\n")

    def progress(self, items: Iterable[T], total: int | None, label: str) -> Iterator[T]:
        """Wrap a long scan with a progress bar on stderr (silent in --json mode)."""
        if self.json_mode or not _is_tty(self.stderr):
            yield from items
            return
        bar = ProgressBar(self.stderr, total, label)
        try:
            for item in items:
                yield item
                bar.advance()
        finally:
            bar.close()


class ProgressBar:
    """A minimal single-line progress bar, redrawn at most every 0.1 s."""

    WIDTH = 30
    REDRAW_INTERVAL_S = 0.1

    def __init__(self, stream: TextIO, total: int | None, label: str) -> None:
        self.stream, self.total, self.label = stream, total, label
        self.done = 0
        self._last_draw = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last_draw >= self.REDRAW_INTERVAL_S:
            self._last_draw = now
            self._draw()

    def _draw(self) -> None:
        if self.total:
            filled = int(self.WIDTH * min(self.done, self.total) / self.total)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total}")
        else:
            self.stream.write(f"\r{self.label} {self.done}")
        self.stream.flush()

    def close(self) -> None:
        self._draw()
        self.stream.write("\n")
        self.stream.flush()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "_asdict"):
        return value._asdict()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return str(value)


# -- tables ---------------------------------------------------------------------------

def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces, with a dashed rule under the header."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def render_mapping(result: dict[str, Any]) -> str:
    """``key  value`` lines for flat results (nested values shown as compact JSON)."""
    width = max((len(k) for k in result), default=0)
    return "\n".join(f"{k.ljust(width)}  {_cell(v)}" for k, v in result.items())


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=_json_default)
    return str(value)


# -- errors ---------------------------------------------------------------------------

def classify(error: BaseException) -> tuple[int, str]:
    """Map a library error onto (exit code, one-line message)."""
    if isinstance(error, CliError):
        return error.exit_code, str(error)
    name = type(error).__name__
    message = str(error) or name

    if _is_refusal(error):
        return EXIT_REFUSED, f"refused: {message}"
    if isinstance(error, _data_errors()):
        return EXIT_DATA, f"data error ({name}): {message}"
    if isinstance(error, StorageUnavailable):
        return EXIT_UNAVAILABLE, f"storage unavailable: {message}"
    local = _os_cause(error)
    if local is not None:
        # A local file-system problem (disk full, permissions, a directory where a file
        # should be) behind a lifecycle error: the stores are not damaged; fix and retry.
        return EXIT_UNAVAILABLE, f"local storage: {message}"
    if isinstance(error, (ValueError, LookupError, StorageError)):
        return EXIT_USAGE, f"{_words(name)}: {message}"
    if isinstance(error, OSError):
        return EXIT_UNAVAILABLE, f"{_words(name)}: {message}"
    return EXIT_INTERNAL, f"internal error ({name}): {message}"


_REFUSAL_NAMES = ("Owner", "Owned", "Ownership", "Fenced", "NotOwner", "Sealed", "AlreadyLoaded", "Refused", "Locked",
                  "OffsetOverflow")


def _data_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the stored bytes or records are damaged, whatever layer found them."""
    from native.errors import CodecError  # deferred: keeps `dnb --help` light
    from tiered.lifecycle.errors import LocalWalUnreadable  # deferred: keeps `dnb --help` light
    from tiered.lifecycle.restore import BrokenChain, RestoreMismatch  # deferred: keeps `dnb --help` light
    from tiered.read.errors import CorruptArchive, DataGap  # deferred: keeps `dnb --help` light
    from wal.errors import CorruptLog  # deferred: keeps `dnb --help` light

    return (CorruptArchive, DataGap, CodecError, CorruptLog, LocalWalUnreadable, BrokenChain, RestoreMismatch,
            MalformedRecord)


def _os_cause(error: BaseException) -> OSError | None:
    seen = 0
    cause = error.__cause__ or error.__context__
    while cause is not None and seen < 16:
        if isinstance(cause, OSError):
            return cause
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return None


def _is_refusal(error: BaseException) -> bool:
    """Ownership/state errors from the lifecycle are refusals: nothing was changed."""
    return any(part in klass.__name__ for klass in type(error).__mro__ for part in _REFUSAL_NAMES)


def _words(name: str) -> str:
    out = "".join(" " + c.lower() if c.isupper() else c for c in name).strip()
    return out or name


def run_command(out: Output, body: Callable[[], int | None]) -> int:
    """Run one command body; library errors become a message on stderr and an exit code."""
    try:
        return body() or EXIT_OK
    except KeyboardInterrupt:
        out.stderr.write("interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK  # `dnb consume ... | head` is a normal way to stop reading.
    except Exception as error:  # noqa: BLE001 - this is the one place errors are mapped
        code, message = classify(error)
        if out.debug:
            traceback.print_exception(error, file=out.stderr)
        if out.json_mode:
            body = {"error": {"type": type(error).__name__, "message": message, "exit_code": code}}
            out.stdout.write(json.dumps(body) + "\n")
            out.stdout.flush()
        out.stderr.write(f"dnb: {message}\n")
        if not out.debug and code == EXIT_INTERNAL:
            out.stderr.write("dnb: run again with --debug for the traceback\n")
        return code
