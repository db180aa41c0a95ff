"""The hot path: frame/record codec, CRC32C, the WAL append core and dnb1 object blocks.

The codec is three pairs of twins, one pair per concept, each a Cython module that mirrors a
pure-Python reference module with the same public names:

* ``_frames`` / ``_frames_py`` — CRC32C, records, frames, frame scanning, segment headers and
  round markers (spec: ``native/format.py``);
* ``_append`` / ``_append_py`` — ``AppendBuffer``, the WAL's append core;
* ``_objects`` / ``_objects_py`` — the dnb1 object primitives behind ``native.object_format``
  (spec and API: ``native/object_format.py``).

The implementation is picked here, by the one rule in ``native/_select.py``:
``DNB_FORCE_PYTHON=1`` selects the pure-Python twins on purpose; otherwise all three Cython
extensions are imported, and if any is missing we fall back to the whole pure-Python set with
a loud warning (the test suite turns that into a failure). :data:`codec` is the chosen set as
one namespace. Everything else imports codec functions from here, never from a twin directly
(``native.columns`` does the same for the columnar decoder).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from native._select import (
    FORCE_PYTHON_ENV,
    FORCED_PYTHON,
    TwinSet,
    both_twin_sets,
    select_twin_set,
)
from native.errors import CodecError, CorruptObject, CorruptSegmentHeader
from native.format import Record, ScanResult, ScanStop

#: Part name -> module, for each implementation of the codec.
PYTHON_MODULES = {"frames": "native._frames_py", "append": "native._append_py",
                  "objects": "native._objects_py"}
CYTHON_MODULES = {"frames": "native._frames", "append": "native._append",
                  "objects": "native._objects"}

if TYPE_CHECKING:
    from native._protocols import CodecTwin

_selected, NATIVE_IMPORT_ERROR = select_twin_set(PYTHON_MODULES, CYTHON_MODULES)
#: The chosen implementation. A TwinSet takes its names from its modules at run time, which a
#: type checker cannot follow: it sees the set through the contract every twin is checked
#: against (native/_twin_check.py statically, tests/native/test_contract.py at run time).
codec = cast("CodecTwin", _selected)

IMPLEMENTATION: str = codec.IMPLEMENTATION

crc32c = codec.crc32c
encode_record = codec.encode_record
encode_frame = codec.encode_frame
encode_batch = codec.encode_batch
decode_record = codec.decode_record
scan_frames = codec.scan_frames
encode_segment_header = codec.encode_segment_header
decode_segment_header = codec.decode_segment_header
encode_round_marker = codec.encode_round_marker
# Many files' commit rounds in one call (one release of the GIL in the compiled twin).
write_rounds = codec.write_rounds
# The WAL's append core (offsets + encoding + pending frames in one atomic step).
AppendBuffer = codec.AppendBuffer
# Pending bytes counted together by many append cores (a commit group's bound).
PendingBudget = codec.PendingBudget

# The dnb1 archive object API (spec in native/object_format.py). These functions dispatch to
# the codec selected above at call time; pass codec= to pick a twin explicitly (tests do).
from native import object_format  # noqa: E402
from native.object_format import (  # noqa: E402
    Block,
    Footer,
    ObjectHeader,
    block_frames,
    decode_block,
    footer_bytes_needed,
    iter_records,
    parse_footer,
    parse_header,
    read_all_frames,
    read_footer,
    read_records,
    select_blocks,
    write_object,
)


def available_codecs() -> list[TwinSet]:
    """Every implementation of the codec that can run here (the pure-Python one always can,
    and comes first)."""
    return both_twin_sets(PYTHON_MODULES, CYTHON_MODULES)


__all__ = [
    "IMPLEMENTATION", "codec", "available_codecs", "crc32c", "encode_record", "encode_frame",
    "encode_batch", "decode_record", "scan_frames", "encode_segment_header", "encode_round_marker",
    "decode_segment_header", "AppendBuffer", "PendingBudget", "Record", "ScanResult", "ScanStop", "CodecError",
    "CorruptObject", "CorruptSegmentHeader", "object_format", "Block", "Footer", "ObjectHeader",
    "write_object", "footer_bytes_needed", "parse_footer", "read_footer", "select_blocks",
    "decode_block", "block_frames", "parse_header", "iter_records", "read_records",
    "read_all_frames",
]
