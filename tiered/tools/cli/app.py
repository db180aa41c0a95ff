"""The click command tree of ``dnb`` and its global options.

Global options (``--json``, ``--data-dir``, ``--broker-id``, …) are accepted before or
after the command: :class:`DnbGroup` and :class:`DnbCommand` add them to every group and
command (hidden below the root, so each command's help stays short), and each one seen
anywhere on the command line is remembered in one :class:`Invocation` (a later one
wins). Commands take it with ``@pass_invocation`` and ask it for their
:class:`Settings`.

Options that set a config key have no click default and no click ``envvar``: the
config loader applies ``DNB_…`` variables and the ``--config`` file itself, so
``dnb config show`` can say where each value came from (flags > env > file > defaults).
Options that are not config keys (``--json``, ``--debug``, ``--broker URL``) take their
``DNB_…`` variable through click.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import click
from click.core import ParameterSource

from tiered.tools.cli.output import Output
from tiered.tools.cli.settings import Settings

#: Library log lines shown by default: errors only. A retry loop's warnings while a store
#: is down would otherwise flood the terminal before the command's own one-line error.
DEFAULT_LOG_LEVEL = logging.ERROR

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

#: Global options that set a config key: option name -> (config key, flag as typed).
KEY_OPTIONS = {"data_dir": ("data_dir", "--data-dir"), "wal_dir": ("wal_dir", "--wal-dir"),
               "metadata": ("metadata", "--metadata"), "objects": ("objects", "--objects"),
               "broker_id": ("broker_id", "--broker-id")}


@dataclass
class Invocation:
    """One ``dnb`` run: its output and the global options given anywhere on the line."""

    out: Output
    given: dict[str, Any] = field(default_factory=dict)
    #: Where library logs go during this run (stderr; installed by ``main``).
    log_handler: logging.Handler = field(default_factory=logging.NullHandler)

    def remember(self, name: str, value: Any, multiple: bool, counted: bool) -> None:
        if multiple:
            self.given.setdefault(name, []).extend(value)
        elif counted:
            self.given[name] = self.given.get(name, 0) + value
        else:
            self.given[name] = value

    def apply(self) -> None:
        """Once the command line is parsed: --json, --debug and the log level."""
        self.out.json_mode = bool(self.option("json", False))
        self.out.debug = bool(self.option("debug", False))
        verbose = self.option("verbose", 0)
        level = logging.DEBUG if self.out.debug or verbose >= 2 else logging.INFO if verbose else DEFAULT_LOG_LEVEL
        # On the handler as well as the root: a library logger with a level of its own
        # (one a long-lived command set earlier in this process) must not get past it.
        self.log_handler.setLevel(level)
        logging.getLogger().setLevel(level)

    def long_lived(self) -> None:
        """A process that serves until SIGTERM (``broker run``, ``cluster run``) logs its
        warnings too: nobody waits for its one-line result."""
        root = logging.getLogger()
        root.setLevel(min(root.level, logging.WARNING))
        # The command raises its own loggers to INFO (transitions); let those through.
        self.log_handler.setLevel(min(self.log_handler.level, logging.INFO))

    def option(self, name: str, default: Any = None) -> Any:
        return self.given.get(name, default)

    def config_flags(self, extra: dict[str, tuple[Any, str]] | None = None) -> dict[str, tuple[Any, str]]:
        """The config keys set on the command line: ``--set`` first, then the named
        options (a named option given together with ``--set`` of the same key wins),
        then the command's own (``broker run --listen …``)."""
        from tiered.config.loader import parse_assignment  # deferred: keeps `dnb --help` light

        flags: dict[str, tuple[Any, str]] = {}
        for text in self.option("settings", []):
            key, value = parse_assignment(text)
            flags[key] = (value, f"--set {key}")
        for name, (key, flag) in KEY_OPTIONS.items():
            if self.option(name) is not None:
                flags[key] = (self.option(name), flag)
        flags.update(extra or {})
        return flags

    def settings(self, extra_flags: dict[str, tuple[Any, str]] | None = None) -> Settings:
        """Load the configuration (flags > ``DNB_…`` env > ``--config`` file > defaults)."""
        from tiered.config import load_config  # deferred: keeps `dnb --help` light

        loaded = load_config(self.option("config"), os.environ, self.config_flags(extra_flags))
        return Settings.from_config(loaded)


pass_invocation = click.make_pass_decorator(Invocation)


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Callback of every global option: note the ones actually given (flag or env)."""
    source = ctx.get_parameter_source(param.name) if param.name else None
    if source in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP):
        return value
    invocation = ctx.find_object(Invocation)
    if invocation is not None and param.name is not None:
        counted = isinstance(param, click.Option) and param.count
        invocation.remember(param.name, value, multiple=param.multiple, counted=bool(counted))
    return value


def global_options(hidden: bool) -> list[click.Parameter]:
    """Fresh option objects (click params must not be shared between commands)."""
    def opt(*decls: str, **kw: Any) -> click.Option:
        return click.Option(decls, callback=_remember, expose_value=False, hidden=hidden, **kw)

    return [
        opt("--config", metavar="FILE", help="TOML config file (env DNB_CONFIG); keys and defaults: docs/CONFIG.md"),
        opt("--set", "settings", multiple=True, metavar="KEY=VALUE",
            help="set any config key, e.g. --set uploader.interval_s=5 (repeatable; beats env and file)"),
        opt("--data-dir", metavar="DIR", help="broker data directory (env DNB_DATA_DIR; default ./dnb-data)"),
        opt("--wal-dir", metavar="DIR", help="WAL directory (env DNB_WAL_DIR; default <data-dir>/wal)"),
        opt("--metadata", metavar="URL",
            help="metadata store: sqlite:///path or etcd://host:port[,host:port][/root] "
                 "(env DNB_METADATA; default sqlite:///<data-dir>/metadata.db)"),
        opt("--objects", metavar="URL",
            help="object store: file:///dir or s3://bucket/prefix[?endpoint=…] "
                 "(env DNB_OBJECTS; default file://<data-dir>/objects)"),
        opt("--broker-id", metavar="ID", help="this broker's id (env DNB_BROKER_ID; default 1)"),
        opt("--json", is_flag=True, envvar="DNB_JSON",
            help="print exactly one JSON object on stdout, errors included (env DNB_JSON=1)"),
        opt("-v", "--verbose", count=True, help="log state transitions (INFO); -vv: everything (DEBUG)"),
        opt("--debug", is_flag=True, envvar="DNB_DEBUG",
            help="tracebacks on errors and DEBUG logs (env DNB_DEBUG=1)"),
    ]


def _add_global_options(command: click.Command, hidden: bool) -> None:
    """Append the global options; a command parameter of the same name would silently
    share its value with one of them (click keys values by name), so that is refused."""
    options = global_options(hidden)
    clash = {p.name for p in command.params} & {p.name for p in options}
    if clash:
        raise TypeError(f"dnb {command.name}: parameter name(s) {sorted(clash)} are global options")
    command.params.extend(options)


class DnbCommand(click.Command):
    """A command that also accepts the global options after its name; its one-line help
    is listed whole in ``dnb --help`` (click would cut it at 45 characters)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", CONTEXT_SETTINGS)
        kwargs.setdefault("epilog", "Global options (dnb --help) may come before or after the command.")
        if kwargs.get("help") and not kwargs.get("short_help"):
            kwargs["short_help"] = kwargs["help"].split("\n\n")[0]
        super().__init__(*args, **kwargs)
        _add_global_options(self, hidden=True)

    def invoke(self, ctx: click.Context) -> Any:
        invocation = ctx.find_object(Invocation)
        if invocation is not None:
            invocation.apply()
        return super().invoke(ctx)


class DnbGroup(click.Group):
    """A group whose commands and sub-groups accept the global options anywhere."""

    command_class = DnbCommand

    def __init__(self, *args: Any, root: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("context_settings", CONTEXT_SETTINGS)
        if kwargs.get("help") and not kwargs.get("short_help"):
            kwargs["short_help"] = kwargs["help"].split("\n\n")[0]
        super().__init__(*args, **kwargs)
        _add_global_options(self, hidden=not root)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)  # the order they are defined in: the workflow's order


DnbGroup.group_class = DnbGroup

