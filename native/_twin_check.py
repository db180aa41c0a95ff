"""Holds each codec twin to its Protocol in ``native/_protocols.py``, for the type checker.

Nothing here runs: the assignments are made only while type checking (``mypy``, which
``tests/test_typecheck.py`` runs). Assigning a module to a Protocol-typed name makes the
checker compare every member of the Protocol with the module's name of the same name, the
compiled twins through their stubs (``native/_frames.pyi``, ``_append.pyi``, ``_objects.pyi``),
so a signature that drifts in either twin, or in a stub, fails the check.
``tests/native/test_contract.py`` checks at run time that each module exposes the names.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from native import _append, _append_py, _frames, _frames_py, _objects, _objects_py
    from native._protocols import AppendTwin, FramesTwin
    from native.object_format import ObjectsTwin

    frames_python: FramesTwin = _frames_py
    frames_compiled: FramesTwin = _frames
    append_python: AppendTwin = _append_py
    append_compiled: AppendTwin = _append
    objects_python: ObjectsTwin = _objects_py
    objects_compiled: ObjectsTwin = _objects
