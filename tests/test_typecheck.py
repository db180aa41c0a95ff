"""The library modules type-check under ``mypy --strict`` (the ``[tool.mypy]`` section of
pyproject.toml lists them), and every package ships ``py.typed``.

The Protocols in ``wal/api.py`` and ``native/_protocols.py`` are only worth something if a
checker holds each implementation to them: this test is that checker's run, so a signature
that drifts from its Protocol, or an unchecked ``None``, fails the suite like any other bug.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    # A fresh cache each run: a stale one cannot hide an error, nor one run's state leak
    # into the next. mypy's compiled build checks these modules in well under a minute.
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy_cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "MYPY_FORCE_COLOR": "0"},
    )
    assert result.returncode == 0, f"mypy found errors:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("package", ["wal", "tiered", "uploader", "native"])
def test_each_package_ships_py_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()
