"""Fail loudly when a top-level name of this distribution is shadowed.

The distribution installs four top-level packages (``native``, ``wal``, ``uploader``,
``tiered``; README.md says why they keep those names). A user's own ``uploader.py`` (or
``wal/`` folder) earlier on ``sys.path`` would otherwise be imported in place of ours and
break an import far away with an unrelated message. :func:`check_siblings` finds where
each sibling resolves *without importing it* and raises an ImportError naming the
shadowing file. Standard library only: it runs at package import, before anything else.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable


def check_siblings(package_file: str, names: Iterable[str]) -> None:
    """Raise ImportError unless every package in ``names`` resolves to the folder of that
    name beside the package whose ``__init__`` is ``package_file``."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(package_file)))
    for name in names:
        expected = os.path.join(root, name)
        module = sys.modules.get(name)
        if module is not None:
            origin = getattr(module, "__file__", None)
            locations = list(getattr(module, "__path__", None) or [])
        else:
            spec = importlib.util.find_spec(name)
            if spec is None:  # not installed: its import fails with Python's own message
                continue
            origin = spec.origin if spec.has_location else None
            locations = list(spec.submodule_search_locations or [])
        if origin is not None and os.path.realpath(os.path.dirname(origin)) == expected and locations:
            continue
        found = origin or (", ".join(locations) if locations else "(built in)")
        package = os.path.basename(os.path.dirname(os.path.realpath(package_file)))
        raise ImportError(
            f"{name!r} resolves to {found}, not to the dnb-storage package {expected}: a module or folder "
            f"named {name!r} earlier on sys.path shadows the package that {package!r} imports. Rename that "
            f"file (or take its directory off sys.path).", name=name, path=origin)
