"""Test doubles stay out of production code.

The fault-injecting doubles live in ``testing/`` subpackages (``wal.testing``,
``tiered.metadata.testing``, ``tiered.objects.testing``). Only tests, benchmarks, the
harness (a test driver) and the doubles themselves may import them.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRODUCTION = ("wal", "uploader", "tiered", "native")
ALLOWED = ("tiered/tools/harness/",)


def _imported_modules(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_production_module_imports_a_testing_package():
    offenders = []
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/testing/" in relative or relative.startswith(ALLOWED):
                continue
            offenders.extend(f"{relative}: {name}" for name in _imported_modules(path)
                             if "testing" in name.split("."))
    assert offenders == []


def test_the_doubles_are_where_this_test_looks():
    for package in ("wal/testing", "tiered/metadata/testing", "tiered/objects/testing"):
        assert (ROOT / package / "__init__.py").is_file(), package
