"""Both twins expose the whole contract, mirror each other module by module, never import each
other, and the selection switch works: forced, all compiled, or (loudly) all pure-Python."""
from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import native
from native._protocols import PART_NAMES, PART_PROTOCOLS, TWIN_NAMES, CodecTwin

NATIVE_DIR = Path(native.__file__).resolve().parent
ROOT = NATIVE_DIR.parent


def test_every_twin_satisfies_the_protocol(codec):
    for name in TWIN_NAMES:
        assert hasattr(codec, name), name
    assert isinstance(codec, CodecTwin)


def test_each_module_mirrors_its_twin(codec):
    """Each part is one module per implementation, exporting exactly the part's names."""
    modules = native.CYTHON_MODULES if codec.IMPLEMENTATION == "cython" else native.PYTHON_MODULES
    assert set(codec.parts) == set(PART_NAMES) == set(modules)
    for part, module in codec.parts.items():
        assert module.__name__ == modules[part]
        assert module.IMPLEMENTATION == codec.IMPLEMENTATION
        assert sorted(module.__all__) == sorted(PART_NAMES[part]), module.__name__
        assert isinstance(module, PART_PROTOCOLS[part]), module.__name__


def test_every_pyx_has_its_pure_python_twin_and_stub():
    for pyx in NATIVE_DIR.glob("_*.pyx"):
        assert pyx.with_name(pyx.stem + "_py.py").exists(), pyx.name
    for name in native.CYTHON_MODULES.values():
        stem = name.rsplit(".", 1)[1]
        assert (NATIVE_DIR / f"{stem}.pyi").exists(), stem


@pytest.mark.parametrize("stem", sorted(p.stem for p in NATIVE_DIR.glob("_*.pyx")))
def test_compiled_and_pure_python_twins_export_the_same_names(stem):
    python_twin = importlib.import_module(f"native.{stem}_py")
    try:
        compiled = importlib.import_module(f"native.{stem}")
    except ImportError:
        pytest.skip(f"native.{stem} is not built here")
    assert sorted(compiled.__all__) == sorted(python_twin.__all__)
    assert (compiled.IMPLEMENTATION, python_twin.IMPLEMENTATION) == ("cython", "python")


def _imported_modules(path: Path) -> set[str]:
    if path.suffix == ".py":
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        return found
    # Cython: `import x`, `from x import ...` and `from x cimport ...` at the start of a line.
    pattern = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\s+\(?\s*([\w ,]*)|c?import\s+([\w.]+))",
                         re.MULTILINE)
    found = set()
    for module, names, plain in pattern.findall(path.read_text()):
        if plain:
            found.add(plain)
            continue
        found.add(module)
        found.update(f"{module}.{n.strip()}" for n in names.split(",") if n.strip())
    return found


def test_twins_never_import_each_other():
    """A compiled module imports no pure-Python twin and a pure-Python twin no compiled module;
    within an implementation, modules may build on each other (objects and append on frames)."""
    python_twins = {p.stem for p in NATIVE_DIR.glob("_*_py.py")}
    compiled = {p.stem for p in NATIVE_DIR.glob("_*.pyx")}
    assert {f"{stem}_py" for stem in compiled} == python_twins
    for stem in compiled:
        imports = _imported_modules(NATIVE_DIR / f"{stem}.pyx")
        assert not {f"native.{t}" for t in python_twins} & imports, stem
    for stem in python_twins:
        imports = _imported_modules(NATIVE_DIR / f"{stem}.py")
        assert not {f"native.{c}" for c in compiled} & imports, stem


def test_force_python_env_selects_the_twin():
    code = "import native; print(native.IMPLEMENTATION, native.NATIVE_IMPORT_ERROR)"
    env = {**os.environ, "DNB_FORCE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["python", "None"]


# Run before `import native` in a fresh interpreter: makes one compiled module unimportable,
# as a missing or broken build would.
_BLOCK_ONE_EXTENSION = """
import importlib.abc, sys
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "native._objects":
            raise ImportError("native._objects blocked by the test")
        return None
sys.meta_path.insert(0, Blocker())
"""


def _run_with_one_extension_missing(code: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "DNB_FORCE_PYTHON"}
    return subprocess.run([sys.executable, "-c", _BLOCK_ONE_EXTENSION + code], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_one_missing_extension_selects_the_whole_python_set_loudly():
    if len(native.available_codecs()) < 2:
        pytest.skip("the Cython twins are not built here")
    code = """
import warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import native
print(native.IMPLEMENTATION, type(native.NATIVE_IMPORT_ERROR).__name__)
print(sorted(m.__name__ for m in native.codec.parts.values()))
print(native.AppendBuffer.__module__, native.encode_batch.__module__)
print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
"""
    result = _run_with_one_extension_missing(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "python ImportError"
    assert lines[1] == str(sorted(native.PYTHON_MODULES.values()))
    assert lines[2] == "native._append_py native._frames_py", "no mix of twins"
    assert "native._objects blocked by the test" in lines[3] and "pure-Python" in lines[3]


def test_suite_refuses_to_run_when_an_extension_did_not_load():
    """tests/conftest.py turns the fallback into a usage error unless Python is forced."""
    if len(native.available_codecs()) < 2:
        pytest.skip("the Cython twins are not built here")
    code = """
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/native/test_docs.py"]))
"""
    result = _run_with_one_extension_missing(code)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "native._objects blocked by the test" in result.stderr + result.stdout


def test_object_api_is_exported():
    for name in ("write_object", "parse_footer", "footer_bytes_needed", "read_footer",
                 "select_blocks", "decode_block", "block_frames", "parse_header", "iter_records",
                 "read_records", "read_all_frames", "Block", "Footer"):
        assert getattr(native, name) is getattr(native.object_format, name)


def test_selected_codec_is_one_of_the_available_ones():
    assert any(native.codec is twin for twin in native.available_codecs())
    assert native.encode_batch is native.codec.encode_batch
    assert native.AppendBuffer is native.codec.AppendBuffer
