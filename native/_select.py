"""The one rule that picks between a compiled twin and its pure-Python reference.

``DNB_FORCE_PYTHON=1`` selects the pure-Python twin on purpose. Otherwise the Cython
extension is imported; if it is missing we fall back with a loud warning and keep the
ImportError, which the test suite's guard turns into a failure (a silent slow path would
let every test pass while the shipped hot path went untested).
"""
from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

FORCE_PYTHON_ENV = "DNB_FORCE_PYTHON"
FORCED_PYTHON = os.environ.get(FORCE_PYTHON_ENV, "") not in ("", "0")


def select_twin(python_twin: ModuleType, native_name: str) -> tuple[ModuleType, ImportError | None]:
    """``(module to use, the ImportError if the extension should have loaded but did not)``."""
    if FORCED_PYTHON:
        return python_twin, None
    try:
        return importlib.import_module(native_name), None
    except ImportError as exc:
        warnings.warn(
            f"{native_name} did not load ({exc}); using the slow pure-Python twin. Rebuild with "
            f"`pip install -e . --no-build-isolation` or set {FORCE_PYTHON_ENV}=1 on purpose.",
            RuntimeWarning,
            stacklevel=3,
        )
        return python_twin, exc


def both_twins(python_twin: ModuleType, native_name: str) -> list[ModuleType]:
    """Every twin that can run here (the pure-Python one always can), for tests and benches."""
    try:
        return [python_twin, importlib.import_module(native_name)]
    except ImportError:
        return [python_twin]
