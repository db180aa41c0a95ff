"""The one error configuration loading raises."""
from __future__ import annotations

from native.errors import DnbError


class ConfigError(DnbError, ValueError):
    """A setting is unknown, of the wrong type or out of range.

    ``key`` is the dotted key (``wal.segment_bytes_max``; None when the problem is the
    source itself, e.g. a file that is not TOML), ``source`` where the value came from
    (``file PATH``, ``env NAME``, ``flag --x``, ``default``)."""

    def __init__(self, key: str | None, source: str, problem: str) -> None:
        where = f"{key} (from {source})" if key else source
        super().__init__(f"{where}: {problem}")
        self.key = key
        self.source = source
        self.problem = problem
