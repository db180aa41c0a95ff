"""The one rule that picks between compiled twins and their pure-Python references.

``DNB_FORCE_PYTHON=1`` selects the pure-Python twins on purpose. Otherwise the Cython
extensions are imported; if one is missing we fall back with a loud warning and keep the
ImportError, which the test suite's guard turns into a failure (a silent slow path would
let every test pass while the shipped hot path went untested).

A twin is either one module (the columnar decoder) or a :class:`TwinSet` of modules that
belong together (the codec: frames, append core, objects). A set is chosen whole: either
every compiled module loads or the pure-Python set is used, never a mix, so the bytes one
part writes are always checked by the same implementation's other parts.
"""
from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Mapping
from functools import cache
from types import ModuleType

FORCE_PYTHON_ENV = "DNB_FORCE_PYTHON"
FORCED_PYTHON = os.environ.get(FORCE_PYTHON_ENV, "") not in ("", "0")

_REBUILD_HINT = (f"Rebuild with `pip install -e . --no-build-isolation` or set {FORCE_PYTHON_ENV}=1 "
                 "on purpose.")


def select_twin(python_twin: ModuleType, native_name: str) -> tuple[ModuleType, ImportError | None]:
    """``(module to use, the ImportError if the extension should have loaded but did not)``."""
    if FORCED_PYTHON:
        return python_twin, None
    try:
        return importlib.import_module(native_name), None
    except ImportError as exc:
        warnings.warn(f"{native_name} did not load ({exc}); using the slow pure-Python twin. "
                      + _REBUILD_HINT, RuntimeWarning, stacklevel=3)
        return python_twin, exc


def both_twins(python_twin: ModuleType, native_name: str) -> list[ModuleType]:
    """Every twin that can run here (the pure-Python one always can), for tests and benches."""
    try:
        return [python_twin, importlib.import_module(native_name)]
    except ImportError:
        return [python_twin]


class TwinSet:
    """One implementation of a group of twin modules, seen as one namespace.

    Holds every name in each module's ``__all__`` (a name exported twice is an error) and
    ``IMPLEMENTATION``, which all the modules must share; ``parts`` maps each part's name to
    its module. Both implementations of a group have the same part names, and the twins of a
    part export the same names (``tests/native/test_contract.py`` checks that).
    """

    def __init__(self, modules: Mapping[str, ModuleType]) -> None:
        implementations = {module.IMPLEMENTATION for module in modules.values()}
        if len(implementations) != 1:
            found = ", ".join(f"{m.__name__} is {m.IMPLEMENTATION}" for m in modules.values())
            raise ImportError(f"twin modules of different implementations mixed: {found}")
        self.IMPLEMENTATION: str = implementations.pop()
        self.parts: dict[str, ModuleType] = dict(modules)
        for module in modules.values():
            for name in module.__all__:
                if name in vars(self):
                    raise ImportError(f"{module.__name__} exports {name!r}, which another part "
                                      "of the same twin set exports too")
                setattr(self, name, getattr(module, name))

    def __repr__(self) -> str:
        return (f"<TwinSet {self.IMPLEMENTATION}: "
                + ", ".join(m.__name__ for m in self.parts.values()) + ">")


@cache
def _twin_set(names: tuple[tuple[str, str], ...]) -> TwinSet:
    """The set of the named modules, built once, so the selected set and the one in
    :func:`both_twin_sets` are the same object."""
    return TwinSet({part: importlib.import_module(name) for part, name in names})


def select_twin_set(python_modules: Mapping[str, str],
                    native_modules: Mapping[str, str]) -> tuple[TwinSet, ImportError | None]:
    """``(set to use, the ImportError if the extensions should have loaded but did not)``.

    Both mappings go from part name to module name. All of ``native_modules`` load, or the
    pure-Python set is used with a warning naming what failed."""
    python_set = _twin_set(tuple(python_modules.items()))
    if FORCED_PYTHON:
        return python_set, None
    try:
        return _twin_set(tuple(native_modules.items())), None
    except ImportError as exc:
        warnings.warn(f"{', '.join(native_modules.values())} did not all load ({exc}); using the "
                      f"slow pure-Python twins {', '.join(python_modules.values())}. " + _REBUILD_HINT,
                      RuntimeWarning, stacklevel=3)
        return python_set, exc


def both_twin_sets(python_modules: Mapping[str, str],
                   native_modules: Mapping[str, str]) -> list[TwinSet]:
    """Every twin set that can run here (the pure-Python one always can), for tests and benches."""
    python_set = _twin_set(tuple(python_modules.items()))
    try:
        return [python_set, _twin_set(tuple(native_modules.items()))]
    except ImportError:
        return [python_set]
