"""The WAL's checkpoint file: small, advisory state written atomically.

Written as temp file -> fsync -> rename -> fsync(dir), so a crash leaves either the old
or the new checkpoint, never a mix. It carries a CRC32C so bit rot is noticed.

What it records and why:
  first_offset        first retained offset after retention (informational)
  sealed_next_offset  base offset of the active segment: everything below it lives in
                      sealed segments, so recovery that finds less has lost whole files
  next_offset         next offset to allocate when written (used only when every segment
                      file is gone, so offsets are never reused from 0)
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from native import crc32c
from wal.fs import FileSystem

_log = logging.getLogger(__name__)

CHECKPOINT_NAME = "wal.ckpt"
_TEMP_SUFFIX = ".tmp"
_VERSION = 1

#: A checkpoint as JSON decodes it: ``topic`` (str) and offsets (int) by name; readers
#: convert each value they use (an older or damaged file may hold anything).
CheckpointState = dict[str, Any]


def write_checkpoint(fs: FileSystem, directory: str, state: CheckpointState, name: str = CHECKPOINT_NAME) -> None:
    body = json.dumps({"version": _VERSION, **state}, sort_keys=True).encode()
    blob = json.dumps({"crc32c": crc32c(body), "body": body.decode()}).encode()
    final = os.path.join(directory, name)
    temp = final + _TEMP_SUFFIX
    if fs.exists(temp):
        fs.remove(temp)  # a leftover from a crash mid-write; it was never renamed in
    handle = fs.open_append(temp)
    try:
        handle.write([blob])
        handle.sync()
    finally:
        handle.close()
    fs.rename(temp, final)
    fs.fsync_dir(directory)


def read_checkpoint(fs: FileSystem, directory: str, name: str = CHECKPOINT_NAME) -> CheckpointState | None:
    """The last checkpoint, or None when there is none or it is unreadable (it is advisory)."""
    path = os.path.join(directory, name)
    if not fs.exists(path):
        return None
    try:
        outer = json.loads(fs.read_all(path))
        body = outer["body"].encode()
        if crc32c(body) != outer["crc32c"]:
            raise ValueError("checkpoint CRC mismatch")
        state: CheckpointState = json.loads(body)
        if state.get("version") != _VERSION:
            raise ValueError(f"unknown checkpoint version {state.get('version')}")
        return state
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # RecursionError: nested too deep
        _log.warning("ignoring unreadable WAL checkpoint %s: %s", path, exc)
        return None
