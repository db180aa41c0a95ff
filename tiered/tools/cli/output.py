"""How the ``dnb`` commands print: one JSON object (``--json``) or readable tables.

Commands never print directly; they build a result dict and hand it to :class:`Output`.
Errors from the library are turned into one clear line on stderr and a non-zero exit
by :func:`run_command`, so every command fails the same way. A traceback appears only
with ``--debug``, because operators need the message, developers need the stack.

Tables are drawn by rich (imported only when something is drawn, so ``dnb --help``
stays fast); progress bars too, and only when both stdout and stderr are terminals and
``--json`` is off, so a pipe or a script never sees them.
"""
from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO, TypeVar

from native.errors import DnbError
from tiered.errors import MalformedRecord, ObjectNotFound, StorageError, StorageUnavailable, TopicNotFound

T = TypeVar("T")

#: Exit codes, each with the stable ``code`` string of the JSON error object. Documented
#: in ``dnb --help`` (:data:`EXIT_CODES_HELP`) and docs/CLI.md.
EXIT_OK = 0
#: The command ran but found a problem (verify not ok, a harness or demo failure).
EXIT_PROBLEMS = 1
#: Bad usage or input: an unknown option, a malformed URL, topic name, offset or SQL.
EXIT_USAGE = 2
#: Refused because the state was not as expected (owned elsewhere, fenced, locked by
#: another process, topic full); nothing was changed.
EXIT_REFUSED = 3
#: A storage backend (metadata store, object store, local disk) is unavailable.
EXIT_UNAVAILABLE = 4
#: The stored data is damaged or inconsistent: a corrupt or missing archive object, a
#: corrupt WAL, a gap, a broken descriptor chain, a malformed metadata record.
EXIT_DATA = 5
#: verify: the archive is consistent, but acknowledged messages are recorded lost (a
#: failover took over a dead owner's unarchived tail); --allow-recorded-loss makes it 0.
EXIT_RECORDED_LOSS = 6
#: The topic does not exist (never created, deleted, or auto_create is off).
EXIT_NOT_FOUND = 7
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

#: exit code -> the ``code`` string of ``{"error": {...}}``; never renamed once released.
ERROR_CODES = {EXIT_PROBLEMS: "problems", EXIT_USAGE: "usage", EXIT_REFUSED: "refused",
               EXIT_UNAVAILABLE: "unavailable", EXIT_DATA: "data", EXIT_RECORDED_LOSS: "recorded_loss",
               EXIT_NOT_FOUND: "not_found",
               EXIT_INTERNAL: "internal", EXIT_INTERRUPTED: "interrupted"}

EXIT_CODES_HELP = """Exit codes:
  0    ok
  1    the command ran and found a problem (verify not ok, a harness or demo failure)
  2    usage: bad option, URL, topic name, offset, config key or SQL
  3    refused: owned elsewhere, fenced, locked, topic full; nothing was changed
  4    unavailable: the metadata store, object store or local disk cannot be reached
  5    data: a corrupt or missing archive object, corrupt WAL, gap, broken chain
  6    verify: consistent, but acknowledged messages are recorded lost (failover)
  7    not found: the topic does not exist (never created, deleted, auto_create off)
  70   internal error (run again with --debug for the traceback)
  130  interrupted (Ctrl-C)

With --json a failed command prints one JSON object on stdout:
  {"error": {"code": "usage|refused|unavailable|data|internal|...",
             "type": "...", "message": "...", "exit_code": N}}
and a one-line "dnb: ..." message on stderr."""


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

    @property
    def shows_progress(self) -> bool:
        """Progress bars only for a person at a terminal: never with --json or a pipe."""
        return not self.json_mode and _is_tty(self.stdout) and _is_tty(self.stderr)

    def progress(self, items: Iterable[T], total: int | None, label: str) -> Iterator[T]:
        """Wrap a long scan with a progress bar on stderr (see :attr:`shows_progress`)."""
        if not self.shows_progress:
            yield from items
            return
        with self.tracker(label, total) as advance:
            for done, item in enumerate(items, 1):
                yield item
                advance(done)

    @contextlib.contextmanager
    def tracker(self, label: str, total: int | None) -> Iterator[Callable[[int], None]]:
        """A progress bar for work reported as "``done`` so far" (``advance(done)``),
        from any thread; a no-op callable when progress is not shown."""
        if not self.shows_progress:
            yield lambda _done: None
            return
        from rich.console import Console  # deferred: keeps `dnb --help` light
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
        lock = threading.Lock()
        with Progress(*columns, console=Console(file=self.stderr), transient=False) as bar:
            task = bar.add_task(label, total=total)

            def advance(done: int) -> None:
                with lock:
                    bar.update(task, completed=done)

            yield advance


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
    """A borderless table: bold headers and a rule under them (on a terminal), left-aligned
    columns two spaces apart; as wide as its content when stdout is not a terminal, so a
    pipe to grep or a file never wraps a row."""
    from rich.box import Box  # deferred: keeps `dnb --help` light
    from rich.table import Table

    # rich's SIMPLE_HEAD drawn with "-": plain ASCII whatever the terminal's encoding.
    rule_under_header = Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
    table = Table(box=rule_under_header, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  header_style="bold", highlight=False)
    for header in headers:
        table.add_column(header, no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*(_text(_cell(v)) for v in row))
    return _to_text(table)


def render_mapping(result: dict[str, Any]) -> str:
    """``key  value`` lines for flat results (nested values shown as compact JSON)."""
    from rich.table import Table  # deferred: keeps `dnb --help` light

    grid = Table.grid(padding=(0, 2, 0, 0))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for key, value in result.items():
        grid.add_row(_text(key), _text(_cell(value)))
    return _to_text(grid)


def _text(value: str) -> Any:
    from rich.text import Text  # deferred: keeps `dnb --help` light

    return Text(value)  # never rich markup: a payload "[red]" is data, not a style


def _to_text(renderable: Any) -> str:
    from rich.console import Console  # deferred: keeps `dnb --help` light

    stdout = sys.stdout
    tty = _is_tty(stdout)
    width = shutil.get_terminal_size().columns if tty else 1 << 16
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=tty, no_color=not tty, highlight=False,
                      soft_wrap=False)
    console.print(renderable)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


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
    if isinstance(error, TopicNotFound):
        return EXIT_NOT_FOUND, f"not found ({type(error).__name__}): {error}"
    usage = _usage_error(error)
    if usage is not None:
        return EXIT_USAGE, usage
    name = type(error).__name__
    message = str(error) or name

    below = _below_retention(error)
    if below is not None:
        # Not damage: retention removed the offsets on purpose. Bad input, like an offset
        # past the end; the message (and --json's first_retained_offset) says where to start.
        return EXIT_USAGE, (f"offset {below.offset} is below retention; the first retained offset is "
                            f"{below.first_offset} (start there, or at 'earliest')")
    if _is_refusal(error):
        return EXIT_REFUSED, f"refused: {message}"
    if isinstance(error, (*_data_errors(), ObjectNotFound)):
        # ObjectNotFound here is an archive object a descriptor names but the store does
        # not have: the archive is inconsistent, not the operator's input.
        return EXIT_DATA, f"data error ({name}): {message}"
    if isinstance(error, StorageUnavailable):
        return EXIT_UNAVAILABLE, f"storage unavailable: {message}"
    if name == "BrokerUnavailable":  # tiered.broker.client (imported only with --broker)
        return EXIT_UNAVAILABLE, (f"broker unavailable: {message} (a topic no broker hosts, sealed and "
                                  "unassigned, answers nowhere: run the command without --broker)")
    # A lifecycle step wraps what failed it (LoadError from a MalformedRecord, ...): the
    # cause says what kind of failure it is.
    data = _cause(error, (*_data_errors(), ObjectNotFound))
    if data is not None:
        return EXIT_DATA, f"data error ({type(data).__name__}): {message}"
    if _cause(error, (StorageUnavailable,)) is not None:
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
                  "OffsetOverflow", "OwnHistoryElsewhere")


def _below_retention(error: BaseException) -> Any:
    """The ``OffsetBelowRetention`` (archive or WAL) ``error`` is, else None."""
    from wal.errors import OffsetBelowRetention  # deferred: keeps `dnb --help` light

    return error if isinstance(error, OffsetBelowRetention) else None


def _data_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the stored bytes or records are damaged, whatever layer found them."""
    from native.errors import CodecError  # deferred: keeps `dnb --help` light
    from tiered.lifecycle.errors import LocalWalUnreadable  # deferred: keeps `dnb --help` light
    from tiered.lifecycle.restore import BrokenChain, RestoreMismatch  # deferred: keeps `dnb --help` light
    from tiered.read.errors import CorruptArchive, DataGap  # deferred: keeps `dnb --help` light
    from wal.errors import CorruptLog  # deferred: keeps `dnb --help` light

    return (CorruptArchive, DataGap, CodecError, CorruptLog, LocalWalUnreadable, BrokenChain, RestoreMismatch,
            MalformedRecord)


def _cause(error: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of ``kinds`` in ``error``'s explicit cause chain (``raise ... from``)."""
    cause, seen = error.__cause__, 0
    while cause is not None and seen < 16:
        if isinstance(cause, kinds):
            return cause
        cause, seen = cause.__cause__, seen + 1
    return None


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


def _usage_error(error: BaseException) -> str | None:
    """The message of a command-line usage error (click's), else None."""
    import click  # deferred: only an error needs it

    if isinstance(error, click.UsageError):
        path = error.ctx.command_path if error.ctx is not None else "dnb"
        if isinstance(error, click.exceptions.NoArgsIsHelpError):  # its message is the whole help
            return f"missing command (see '{path} --help')"
        return f"{error.format_message()} (see '{path} --help')"
    if isinstance(error, click.ClickException):
        return error.format_message()
    return None


def error_json(error: BaseException, code: int, message: str) -> dict[str, Any]:
    """``{"error": {code, type, message, exit_code}}``: the one shape of every --json failure
    (an offset below retention adds ``offset`` and ``first_retained_offset``)."""
    body: dict[str, Any] = {"code": ERROR_CODES.get(code, "internal"), "type": type(error).__name__,
                            "message": message, "exit_code": code}
    below = _below_retention(error)
    if below is not None:
        body["offset"] = below.offset
        body["first_retained_offset"] = below.first_offset
    return {"error": body}


def run_command(out: Output, body: Callable[[], int | None]) -> int:
    """Run one command body; library errors become a message on stderr and an exit code."""
    import click  # deferred: only the error paths need it

    try:
        return body() or EXIT_OK
    except (KeyboardInterrupt, click.Abort) as error:
        if out.json_mode:
            out.stdout.write(json.dumps(error_json(error, EXIT_INTERRUPTED, "interrupted")) + "\n")
        out.stderr.write("dnb: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK  # `dnb consume ... | head` is a normal way to stop reading.
    except Exception as error:  # noqa: BLE001 - this is the one place errors are mapped
        code, message = classify(error)
        if out.debug:
            traceback.print_exception(error, file=out.stderr)
        if out.json_mode:
            out.stdout.write(json.dumps(error_json(error, code, message)) + "\n")
            out.stdout.flush()
        out.stderr.write(f"dnb: {message}\n")
        if not out.debug and code == EXIT_INTERNAL:
            out.stderr.write("dnb: run again with --debug for the traceback\n")
        return code
