"""A WAL directory's identity: ``<wal dir>/.walid``, 16 random bytes written once, when the
WAL is first opened, and never changed.

The shared journal (``wal.journal``) names the WAL instance each of its entries belongs to
by this id, not by the topic's path: a WAL deleted (its topic sealed and moved away, or
deleted) and created again at the same path gets a new id, so a replay after a crash can
never write the old instance's rounds into the new one. The file is a dot file
(bookkeeping, like ``.owner``): ``wal.fs.crash_safe_order`` removes it after the segments,
so a directory whose deletion was interrupted still says whose segments are left.

Every WAL has one (journaled or not): a broker records the id of the WAL an epoch writes in
the topic's open state, so a later load tells that WAL from another one of the same topic
(an older one, one on another disk) whatever else is damaged (tiered/lifecycle/retire.py).
"""
from __future__ import annotations

import json
import os

from native import crc32c
from native.journal_format import WAL_ID_BYTES
from wal.errors import CorruptLog
from wal.fs import FileSystem

WAL_ID_NAME = ".walid"
_TEMP_SUFFIX = ".tmp"


def read_wal_id(fs: FileSystem, directory: str) -> bytes | None:
    """The directory's WAL id; None when it has none or the file does not parse or
    fails its checksum (nothing can then be attributed to it)."""
    path = os.path.join(directory, WAL_ID_NAME)
    try:
        if not fs.exists(path):
            return None
        body = json.loads(fs.read_all(path))
        raw = bytes.fromhex(body["wal_id"])
        if len(raw) != WAL_ID_BYTES or crc32c(raw) != body["crc32c"]:
            return None
        return raw
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):  # RecursionError: nested too deep
        return None


def has_wal_id_file(fs: FileSystem, directory: str) -> bool:
    return fs.exists(os.path.join(directory, WAL_ID_NAME))


def ensure_wal_id(fs: FileSystem, directory: str) -> bytes:
    """The directory's WAL id, created durably (temp, fsync, rename, fsync dir) if it has
    none yet. A directory that holds no WAL yet (no segment, no checkpoint: new, or what an
    interrupted delete left) always gets a NEW id, so rounds a journal still holds of a
    deleted instance never name the one created in its place. A file that exists but does
    not parse, beside segments, is never replaced here: the journal may hold rounds of that
    instance (replay refuses such a directory first)."""
    names = fs.listdir(directory)
    holds_wal = any(n.endswith(".seg") or n == "wal.ckpt" for n in names)
    found = read_wal_id(fs, directory) if holds_wal else None
    if found is not None:
        return found
    path = os.path.join(directory, WAL_ID_NAME)
    if holds_wal and fs.exists(path):
        raise CorruptLog(path, 0, "the WAL id file does not parse or fails its checksum")
    wal_id = os.urandom(WAL_ID_BYTES)
    temp = path + _TEMP_SUFFIX
    if fs.exists(temp):
        fs.remove(temp)
    handle = fs.open_append(temp)
    try:
        handle.write([json.dumps({"wal_id": wal_id.hex(), "crc32c": crc32c(wal_id)}).encode()])
        handle.sync()
    finally:
        handle.close()
    fs.rename(temp, path)
    fs.fsync_dir(directory)
    return wal_id
