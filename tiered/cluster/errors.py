"""Errors of the load manager.

The decision core raises only for inputs it cannot reason about (a malformed view or
configuration); everything else is an answer (actions, skip reasons, alarms), never an
exception, so the runtime can act on every call.
"""
from __future__ import annotations

from native.errors import DnbError


class ClusterError(DnbError):
    """Base class of every load-manager error."""


class ConfigError(ClusterError, ValueError):
    """A load-manager setting is out of range or of the wrong type; names the setting."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"load manager setting {setting!r}: {problem}")
        self.setting = setting
        self.problem = problem


class InvalidView(ClusterError, ValueError):
    """The cluster view handed to the decision core contradicts itself (for example a
    placement naming a broker the view does not list); names what and where."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"invalid cluster view at {where}: {problem}")
        self.where = where
        self.problem = problem
