"""Load a :class:`DnbConfig` from defaults, a TOML file, ``DNB_…`` variables and flags.

Precedence, lowest to highest: defaults < file < environment < flags. Each value
remembers where it came from (``default``, ``file PATH``, ``env NAME``, ``flag --x``)
so ``dnb config show`` can say it and every error can name it. Unknown keys and values
of the wrong type are errors, never ignored: a typo (or a renamed key such as
``fsync_interval_ms``, now gone) must not silently keep a default.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tiered.config.errors import ConfigError
from tiered.config.model import DnbConfig
from tiered.config.schema import Key, by_env, by_name, is_section, keys, sections

#: ``DNB_…`` variables that start like a section but are not settings.
NOT_SETTINGS_ENV = frozenset({"DNB_BROKER_URL"})
#: Variables an earlier ``dnb broker run`` read; setting one now is an error that names
#: its replacement rather than a value silently ignored.
RENAMED_ENV = {
    "DNB_LISTEN": "DNB_SERVER_LISTEN_HOST and DNB_SERVER_LISTEN_PORT",
    "DNB_ADVERTISE": "DNB_BROKER_ADVERTISED_ADDRESS",
}
#: The variable naming a config file when ``--config`` is not given.
CONFIG_ENV = "DNB_CONFIG"
DEFAULT = "default"


@dataclass(frozen=True)
class LoadedConfig:
    """A :class:`DnbConfig` and, for every key, where its value came from."""

    config: DnbConfig
    sources: Mapping[str, str]
    file: str | None = None

    def value(self, key: str) -> Any:
        node: Any = self.config
        for part in key.split("."):
            node = getattr(node, part)
        return node

    def rows(self) -> list[tuple[str, Any, str]]:
        """(key, value, source) for every key, in declaration order."""
        return [(k.name, self.value(k.name), self.sources[k.name]) for k in keys()]


def load_config(file: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
                flags: Mapping[str, tuple[Any, str]] | None = None) -> LoadedConfig:
    """Defaults, then ``file`` (else ``$DNB_CONFIG`` if set), then ``environ`` (default
    ``os.environ``), then ``flags`` (``{key: (value, "--flag")}``; a str value is parsed
    like an env var, anything else must already have the key's type).

    Raises :class:`ConfigError` naming the key and its source."""
    environ = os.environ if environ is None else environ
    if file is None and environ.get(CONFIG_ENV):
        file = environ[CONFIG_ENV]
    values: dict[str, tuple[Any, str]] = {}
    if file is not None:
        values.update(_from_file(os.fspath(file)))
    values.update(_from_env(environ))
    values.update(_from_flags(flags or {}))
    config = _build(DnbConfig, (), values)
    sources = {k.name: values[k.name][1] if k.name in values else DEFAULT for k in keys()}
    return LoadedConfig(config, sources, os.fspath(file) if file is not None else None)


def from_toml(path: str | os.PathLike[str]) -> DnbConfig:
    """The config a TOML file describes (defaults for what it leaves out; no env)."""
    return load_config(path, environ={}).config


# -- sources ---------------------------------------------------------------------------

def _from_file(path: str) -> dict[str, tuple[Any, str]]:
    source = f"file {path}"
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(None, source, "no such file") from None
    except OSError as e:
        raise ConfigError(None, source, f"cannot read it: {e}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(None, source, f"not valid TOML: {e}") from e
    out: dict[str, tuple[Any, str]] = {}
    _walk_table(data, (), source, out)
    return out


def _walk_table(table: Mapping[str, Any], prefix: tuple[str, ...], source: str,
                out: dict[str, tuple[Any, str]]) -> None:
    for name, value in table.items():
        path = (*prefix, name)
        dotted = ".".join(path)
        if path in sections():
            if not isinstance(value, dict):
                raise ConfigError(dotted, source, f"is a section; expected a table [{dotted}], got {value!r}")
            _walk_table(value, path, source, out)
            continue
        key = by_name().get(dotted)
        if key is None:
            raise ConfigError(dotted, source, "unknown key" + _suggest(dotted, list(by_name())))
        if isinstance(value, dict):
            raise ConfigError(dotted, source, "expected a value, got a table")
        try:
            out[dotted] = (key.convert(value), source)
        except ValueError as e:
            raise ConfigError(dotted, source, _with_unit(key, str(e))) from None


def _from_env(environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    out: dict[str, tuple[Any, str]] = {}
    prefixes = tuple("DNB_" + "_".join(s).upper() + "_" for s in sections() if len(s) == 1)
    for name in sorted(environ):
        if not name.startswith("DNB_"):
            continue
        source = f"env {name}"
        key = by_env().get(name)
        if key is None:
            if name in RENAMED_ENV:
                raise ConfigError(None, source, f"no longer read; use {RENAMED_ENV[name]}")
            if name.startswith(prefixes) and name not in NOT_SETTINGS_ENV:
                raise ConfigError(None, source, "not a setting" + _suggest(name, list(by_env())))
            continue  # another DNB_ variable (DNB_JSON, DNB_FORCE_PYTHON, ...), not ours
        try:
            out[key.name] = (key.parse(environ[name]), source)
        except ValueError as e:
            raise ConfigError(key.name, source, _with_unit(key, str(e))) from None
    return out


def _from_flags(flags: Mapping[str, tuple[Any, str]]) -> dict[str, tuple[Any, str]]:
    out: dict[str, tuple[Any, str]] = {}
    for name, (value, flag) in flags.items():
        source = f"flag {flag}"
        key = by_name().get(name)
        if key is None:
            raise ConfigError(name, source, "unknown key" + _suggest(name, list(by_name())))
        try:
            out[name] = (key.parse(value) if isinstance(value, str) else key.convert(value), source)
        except ValueError as e:
            raise ConfigError(name, source, _with_unit(key, str(e))) from None
    return out


def parse_assignment(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (from ``--set``) as (key, value text)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ConfigError(None, f"flag --set {text}", "expected KEY=VALUE, e.g. uploader.interval_s=5")
    return name.strip(), value


# -- building --------------------------------------------------------------------------

def _build(kind: type, prefix: tuple[str, ...], values: Mapping[str, tuple[Any, str]]) -> Any:
    hints = typing.get_type_hints(kind)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(kind):
        path = (*prefix, f.name)
        dotted = ".".join(path)
        if is_section(hints[f.name]):
            if any(name.startswith(dotted + ".") for name in values):
                kwargs[f.name] = _build(hints[f.name], path, values)
        elif dotted in values:
            kwargs[f.name] = values[dotted][0]
    try:
        return kind(**kwargs)
    except (ValueError, TypeError) as e:
        raise _blame(e, kind, prefix, values) from e


def _blame(error: Exception, kind: type, prefix: tuple[str, ...],
           values: Mapping[str, tuple[Any, str]]) -> ConfigError:
    """A section refused its values: name the key (and its source) the message is about.

    The layers' own checks name the field (``max_message_bytes must be in [1, …]``); the
    longest field name in the message is the culprit. A check across fields (say
    ``ack_lease_margin_s`` against ``session_ttl_s``) may name a default; prefer a key
    that was set, whose source can be changed."""
    message = str(error)
    names = sorted((f.name for f in dataclasses.fields(kind)), key=len, reverse=True)
    mentioned = [n for n in names if n in message]
    given = [n for n in mentioned if ".".join((*prefix, n)) in values]
    candidates = given or mentioned
    field_name = candidates[0] if candidates else None
    section = ".".join(prefix) or "(top level)"
    if field_name is None:
        set_here = sorted({src for name, (_, src) in values.items() if name.startswith(".".join(prefix))})
        return ConfigError(section, ", ".join(set_here) or DEFAULT, message)
    dotted = ".".join((*prefix, field_name))
    return ConfigError(dotted, values.get(dotted, (None, DEFAULT))[1], message)


# -- messages --------------------------------------------------------------------------

def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else "; see docs/CONFIG.md for the keys"


def _with_unit(key: Key, problem: str) -> str:
    unit = unit_of(key)
    return f"{problem} ({unit})" if unit else problem


def unit_of(key: Key) -> str:
    """The unit a key's name promises, from the team's naming rule."""
    last = key.path[-1]
    if last.endswith("_s"):
        return "seconds"
    if "bytes" in last.split("_"):
        return "bytes"
    return ""
