"""Suite-wide guards and fixtures.

The most important guard: unless DNB_FORCE_PYTHON is set on purpose, the Cython extension
must have loaded. A silent fallback to the pure-Python twin would make every test pass
against the slow path while the hot path shipped untested.
"""
from __future__ import annotations

import importlib.util
import os

import pytest

import native
import native.columns

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# Server fixtures (real etcd, moto over HTTP) live in one plugin module.
if importlib.util.find_spec("tests.fixtures.servers") is not None:
    pytest_plugins = ["tests.fixtures.servers"]


def pytest_sessionstart(session: pytest.Session) -> None:
    if native.FORCED_PYTHON:
        return
    codec_modules = ", ".join(native.CYTHON_MODULES.values())
    for name, module in ((codec_modules, native), ("native._columns", native.columns)):
        if module.NATIVE_IMPORT_ERROR is not None or module.IMPLEMENTATION != "cython":
            raise pytest.UsageError(
                f"Cython extension(s) {name} did not load: {module.NATIVE_IMPORT_ERROR!r}. "
                "Build with `pip install -e . --no-build-isolation` "
                f"or set {native.FORCE_PYTHON_ENV}=1 to test the pure-Python twins on purpose."
            )


def pytest_report_header(config: pytest.Config) -> str:
    return f"dnb codec: {native.IMPLEMENTATION} (twins available: " + ", ".join(
        c.IMPLEMENTATION for c in native.available_codecs()) + ")"


@pytest.fixture(params=[c.IMPLEMENTATION for c in native.available_codecs()])
def codec(request):
    """Each available codec twin in turn; tests that take it run over both."""
    for twin in native.available_codecs():
        if twin.IMPLEMENTATION == request.param:
            return twin
    raise AssertionError(request.param)
