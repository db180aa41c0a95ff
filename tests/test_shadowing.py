"""A user's own module named like one of our top-level packages fails the import at once,
with an ImportError naming the shadowing file (README.md, "Import names")."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_in(directory: str, statement: str) -> subprocess.CompletedProcess[str]:
    # ``-c`` puts the working directory first on sys.path, as running a script there would.
    return subprocess.run([sys.executable, "-c", statement], cwd=directory, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=120)


@pytest.mark.parametrize("shadow, statement", [
    ("uploader.py", "import tiered.lifecycle"),
    ("wal.py", "import tiered.lifecycle"),
    ("wal.py", "import uploader"),
])
def test_a_shadowing_module_is_named_in_the_import_error(tmp_path, shadow: str, statement: str) -> None:
    (tmp_path / shadow).write_text("MINE = True\n")
    proc = _import_in(str(tmp_path), statement)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and str(tmp_path / shadow) in last, proc.stderr
    assert "shadows" in last


def test_a_shadowing_package_is_named_too(tmp_path) -> None:
    # (A folder without __init__.py shadows nothing: Python prefers a regular package.)
    (tmp_path / "uploader").mkdir()
    (tmp_path / "uploader" / "__init__.py").write_text("")
    proc = _import_in(str(tmp_path), "import tiered.lifecycle")
    assert proc.returncode != 0 and str(tmp_path / "uploader" / "__init__.py") in proc.stderr, proc.stderr


def test_without_a_shadow_the_packages_import(tmp_path) -> None:
    (tmp_path / "unrelated.py").write_text("")
    proc = _import_in(str(tmp_path), "import tiered.lifecycle, uploader, wal, native")
    assert proc.returncode == 0, proc.stderr
