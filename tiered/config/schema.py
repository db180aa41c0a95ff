"""The keys of :class:`~tiered.config.model.DnbConfig`, read off the dataclasses.

A key is the dotted path of a leaf field (``wal.segment_bytes_max``,
``uploader.retention.age_max_s``); a field whose type is a dataclass is a section
(a TOML table). Its environment variable is ``DNB_`` + the path joined by ``_`` in upper
case (``DNB_WAL_SEGMENT_BYTES_MAX``). The schema is derived, never written down, so a
field added to a layer's dataclass is a key at once (and the docs test asks for its
description).
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tiered.config.model import DnbConfig
from wal.config import SECONDS_MAX, SIZE_MAX

#: Fields that are not configuration: composed from other sections (``broker``'s copies
#: of ``wal`` and ``uploader``) or only settable from code (a crash-test hook).
NOT_KEYS = frozenset({"broker.wal_config", "broker.uploader", "uploader.fault_hook"})

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True, slots=True)
class Key:
    path: tuple[str, ...]
    type: Any
    default: Any

    @property
    def name(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return "DNB_" + "_".join(self.path).upper()

    @property
    def optional(self) -> bool:
        return _unwrap_optional(self.type)[1]

    @property
    def base_type(self) -> Any:
        return _unwrap_optional(self.type)[0]

    def convert(self, value: Any) -> Any:
        """A value from TOML (or already typed) as this key's type; ValueError says why."""
        base, optional = _unwrap_optional(self.type)
        if value is None:
            if optional:
                return None
            raise ValueError("may not be empty")
        return self._bounded(_convert(base, value, from_text=False))

    def parse(self, text: str) -> Any:
        """A value from an environment variable or ``--set`` (always text)."""
        base, optional = _unwrap_optional(self.type)
        if optional and text.strip().lower() in ("", "none"):
            return None
        return self._bounded(_convert(base, text, from_text=True))

    def _bounded(self, value: Any) -> Any:
        """``value`` if it is within the bounds every key has on top of its own checks: a
        duration (a key named ``*_s``) at most ``SECONDS_MAX``, a whole number at most
        ``SIZE_MAX`` in size (why: ``wal.config``)."""
        if isinstance(value, bool):
            return value
        if isinstance(value, float) and self.path[-1].endswith("_s") and value > SECONDS_MAX:
            raise ValueError(f"expected at most {SECONDS_MAX:.0e} s, got {value!r}")
        if isinstance(value, int) and abs(value) > SIZE_MAX:
            raise ValueError(f"expected a whole number of at most 2**53 in size, got {value!r}")
        return value


def is_section(kind: Any) -> bool:
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


@functools.cache
def keys() -> tuple[Key, ...]:
    """Every key of :class:`DnbConfig`, in declaration order."""
    return tuple(_walk(DnbConfig, DnbConfig(), ()))


@functools.cache
def sections() -> tuple[tuple[str, ...], ...]:
    """Every section path (``("uploader",)``, ``("uploader", "retention")``, ...)."""
    out: list[tuple[str, ...]] = []
    for key in keys():
        for depth in range(1, len(key.path)):
            if key.path[:depth] not in out:
                out.append(key.path[:depth])
    return tuple(out)


@functools.cache
def by_name() -> dict[str, Key]:
    return {key.name: key for key in keys()}


@functools.cache
def by_env() -> dict[str, Key]:
    index: dict[str, Key] = {}
    for key in keys():
        if key.env in index:  # two paths joining to one variable name: a schema bug
            raise AssertionError(f"{key.name} and {index[key.env].name} share {key.env}")
        index[key.env] = key
    return index


def _walk(kind: type, instance: Any, prefix: tuple[str, ...]) -> Iterator[Key]:
    hints = typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        path = (*prefix, f.name)
        if ".".join(path) in NOT_KEYS:
            continue
        value = getattr(instance, f.name)
        if is_section(hints[f.name]):
            yield from _walk(hints[f.name], value, path)
        else:
            yield Key(path, hints[f.name], value)


def _unwrap_optional(kind: Any) -> tuple[Any, bool]:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(kind)):
            return args[0], True
    return kind, False


def _convert(kind: Any, value: Any, from_text: bool) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if from_text and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(f"expected true or false, got {value!r}")
    if kind is int:
        if from_text:
            try:
                return int(value.strip())
            except ValueError:
                raise ValueError(f"expected a whole number, got {value!r}") from None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError(f"expected a whole number, got {value!r}")
    if kind is float:
        if from_text:
            try:
                number = float(value.strip())
            except ValueError:
                raise ValueError(f"expected a number, got {value!r}") from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            raise ValueError(f"expected a number, got {value!r}")
        if not math.isfinite(number):
            raise ValueError(f"expected a finite number, got {value!r}")
        return number
    if kind is str:
        if isinstance(value, str):
            return value
        raise ValueError(f"expected a string, got {value!r}")
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        choices = ", ".join(str(m.value) for m in kind)
        try:
            return kind(value.strip() if from_text else value)
        except (ValueError, AttributeError):
            raise ValueError(f"expected one of {choices}, got {value!r}") from None
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        items = [part.strip() for part in value.split(",") if part.strip()] if from_text else value
        if not isinstance(items, (list, tuple)):
            raise ValueError(f"expected a list, got {value!r}")
        return tuple(_convert(item, v, from_text) for v in items)
    raise TypeError(f"no conversion for {kind!r}")  # a new field type: extend this function
