"""Both twins expose the whole contract and the selection switch works."""
from __future__ import annotations

import os
import subprocess
import sys

import native
from native._protocols import TWIN_NAMES, CodecTwin


def test_every_twin_satisfies_the_protocol(codec):
    for name in TWIN_NAMES:
        assert hasattr(codec, name), name
    assert isinstance(codec, CodecTwin)


def test_force_python_env_selects_the_twin():
    code = "import native; print(native.IMPLEMENTATION, native.NATIVE_IMPORT_ERROR)"
    env = {**os.environ, "DNB_FORCE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["python", "None"]


def test_object_api_is_exported():
    for name in ("write_object", "parse_footer", "footer_bytes_needed", "read_footer",
                 "select_blocks", "decode_block", "block_frames", "parse_header", "iter_records",
                 "read_records", "read_all_frames", "Block", "Footer"):
        assert getattr(native, name) is getattr(native.object_format, name)
