"""Columnar decoding of WAL frames: records → Arrow-layout buffers, no per-row Python objects.

This docstring is the specification of :func:`decode_columns`; both twins
(``native/_columns.pyx`` and ``native/_columns_py.py``) implement it and return identical
buffers. The twin is picked by the one rule in ``native/_select.py``, as for the codec:
``DNB_FORCE_PYTHON=1`` selects the pure-Python twin on purpose; otherwise the Cython
extension ``native._columns`` is imported, and if it is missing we fall back with a loud
warning (the test suite turns that into a failure via :data:`NATIVE_IMPORT_ERROR`).

Input
=====
``frames`` is a bytes-like run of whole WAL frames (``native/format.py``) with contiguous
offsets, normally what ``native.block_frames`` returned for one or more adjacent blocks —
their CRCs are *not* checked again here (the block reader already did). Record structure is
still validated in full, because these buffers go straight into Arrow: a frame header that
does not fit, an impossible length, a non-contiguous offset, an unknown record version or
flag, a key or attribute that runs past its record, zero attributes behind the attributes
flag, attribute text that is not strict UTF-8, a repeated attribute name (the writer takes a
mapping, so it can never write one, and a map with two values for a key has no one right
reading) or an offset/publish time above 2**63 - 1 (Arrow's int64) raises
:class:`ColumnsError` (a ``CodecError``) whose ``position`` is the byte position of the bad
frame in ``frames``. No buffers are returned for input with any bad frame, even one outside
the requested range.

Filtering
=========
Rows are the records with ``first_offset <= offset <= last_offset`` and
``min_publish_time <= publish_time <= max_publish_time`` (inclusive; ``None`` = unbounded).

Output: :class:`Columns`
========================
All integers little-endian. ``n`` = ``count`` = rows kept; ``E`` = ``attribute_count``.

=====================  ==================================================================
offsets                int64 x n
publish_times_ms       int64 x n (milliseconds since the epoch)
key_validity           ceil(n / 8) bytes, Arrow bit order (row i = bit i % 8 of byte i // 8),
                       bit set = key present (``b""`` is present and empty); unused bits 0
key_null_count         rows without a key
key_offsets, key_data  int32 x (n + 1) from 0, and the keys' bytes (nothing for a null key)
payload_offsets/_data  int32 x (n + 1) from 0, and the payloads' bytes
attribute_offsets      int32 x (n + 1) from 0: row i's attributes are entries
                       ``[attribute_offsets[i], attribute_offsets[i + 1])``, in record order
attribute_names_*      int32 x (E + 1) offsets and UTF-8 bytes of the names
attribute_values_*     int32 x (E + 1) offsets and UTF-8 bytes of the values
frame_count            frames in ``frames`` (all validated, whatever the filter)
first_frame_offset     offset of the first frame (None when ``frames`` is empty)
last_frame_offset      offset of the last frame (None when ``frames`` is empty)
=====================  ==================================================================

Every variable-length buffer uses int32 offsets (Arrow ``binary``/``string``, which is what
Spark expects). When a buffer of the kept rows would pass ``buffer_bytes_max`` (default and
ceiling 2**31 - 1) the call raises :class:`ColumnsTooLarge` before allocating anything; the
caller narrows the offset range and retries.
"""
from __future__ import annotations

from types import ModuleType

from native import _columns_py
from native._select import FORCED_PYTHON, both_twins, select_twin
from native.errors import ColumnsError, ColumnsTooLarge
from native.format import COLUMN_BUFFER_BYTES_MAX as BUFFER_BYTES_MAX
from native.format import Columns

twin, NATIVE_IMPORT_ERROR = select_twin(_columns_py, "native._columns")

IMPLEMENTATION: str = twin.IMPLEMENTATION
decode_columns = twin.decode_columns


def available_twins() -> list[ModuleType]:
    """Every twin that can run here (the pure-Python one always can)."""
    return both_twins(_columns_py, "native._columns")


__all__ = [
    "IMPLEMENTATION", "NATIVE_IMPORT_ERROR", "FORCED_PYTHON", "BUFFER_BYTES_MAX", "Columns",
    "ColumnsError", "ColumnsTooLarge", "decode_columns", "available_twins",
]
