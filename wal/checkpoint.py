"""The WAL's checkpoint file: small, advisory state, written so that a crash leaves either
the old or the new checkpoint, never a mix. It carries a CRC32C so bit rot is noticed.

Two layouts, both read:

* **whole file** (``in_place=False``; the journal's checkpoint, and every WAL checkpoint
  written before the two-slot layout): one JSON document, written as temp file -> fsync
  -> rename -> fsync(dir).
* **two slots** (``in_place=True``; a WAL's ``wal.ckpt``): a file of exactly
  ``2 * SLOT_BYTES`` bytes, each half one slot::

      magic "DNBCKPT2" (8) | sequence u64 LE | body length u32 LE | CRC32C u32 LE | body

  The CRC covers the sequence, the length and the body (the JSON document of the whole
  file layout's ``body``). The checkpoint is the valid slot (CRC, and a body this code
  reads: version, offsets) with the highest sequence. A write puts sequence + 1 into the
  OTHER slot, in place (``pwrite``, then ``fdatasync``): a crash that tears it leaves the
  slot it did not touch, which is the checkpoint before the write. That assumes what
  disks promise: a power loss leaves each sector (512 B or 4 KiB) it was writing either
  old or new, and touches no other. The other slot's sectors hold the same bytes before
  and after a write, also where a kernel with pages larger than a slot writes both back
  together. One write and one data sync on a file whose size never changes: no new
  file, no rename, no directory sync (at 1,000 WALs opened after a crash that was about
  0.6 ms less per WAL on this project's machines: docs/WAL.md, "Recovery"). The file is
  created (and a whole-file one converted) the whole-file way, with the state in both
  slots: until a WAL's first checkpoint write after the upgrade it keeps the old layout,
  whose writes need free space for a new file.

  A release from before the two-slot layout reads such a file as unreadable: it opens the
  WAL without the checkpoint's checks (advisory, nothing lost) and writes the whole-file
  layout again.

  **Unsynced writes.** A write may skip its ``fdatasync`` (``sync=False``) only where the
  slot it keeps (the newest before it) is durable: a power loss then leaves that one
  whatever happens to the new slot. So the write after an unsynced one first syncs the
  file (``presync``), making the unsynced slot durable before the other one is written
  over. A WAL writes unsynced only at its open in a journaled group whose start made the
  whole root durable (``wal.journal._settle_segments``); see ``WriteAheadLog.open``.

  Bit rot of the newest slot makes the one before it the checkpoint: an older
  checkpoint, which vouches for less (a lower ``next_offset`` and ``sealed_next_offset``:
  both only grow), except ``first_offset``, which retention raises before it unlinks the
  segments below it. So a write that raises ``first_offset`` fills BOTH slots with the
  new state (``both_slots``) before anything is unlinked: no slot then asks for the
  segments it removes.

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
import struct
from typing import Any

from native import crc32c
from wal.fs import FileSystem

_log = logging.getLogger(__name__)

CHECKPOINT_NAME = "wal.ckpt"
_TEMP_SUFFIX = ".tmp"
_VERSION = 1

#: The two-slot layout (see the module docstring).
SLOT_BYTES = 4096
SLOT_MAGIC = b"DNBCKPT2"
_SLOT_HEAD = struct.Struct("<QI")  # sequence, body length; the CRC32C (u32 LE) follows
_SLOT_BODY_START = len(SLOT_MAGIC) + _SLOT_HEAD.size + 4
_SLOT_BODY_MAX = SLOT_BYTES - _SLOT_BODY_START
_SEQUENCE_LAST = (1 << 64) - 1

#: A checkpoint as JSON decodes it: ``topic`` (str) and offsets (int) by name; readers
#: convert each value they use (an older or damaged file may hold anything).
CheckpointState = dict[str, Any]
#: The fields a reader converts with int(): each must be a whole number a WAL can hold.
_OFFSET_FIELDS = ("first_offset", "sealed_next_offset", "next_offset", "file", "position", "round")
_OFFSET_LAST = (1 << 63) - 1


#: Where the newest slot of a two-slot file is: (slot index, sequence).
SlotHint = tuple[int, int]


def write_checkpoint(fs: FileSystem, directory: str, state: CheckpointState, name: str = CHECKPOINT_NAME,
                     in_place: bool = False, both_slots: bool = False, presync: bool = False,
                     sync: bool = True, hint: SlotHint | None = None) -> SlotHint | None:
    """Replace the checkpoint ``name`` in ``directory`` with ``state``, durably; raises (and
    the old checkpoint stays) if it cannot. ``in_place``: the two-slot layout (see the
    module docstring), written in place when the file already has it; ``both_slots``: and
    every slot says ``state`` once it returns (a write that raises ``first_offset``).
    In place only (see "Unsynced writes" above): ``presync`` syncs the file before writing
    (its newest slot may be unsynced); ``sync=False`` leaves the new slot unsynced (a new
    file is always synced). ``hint``: the newest slot as the caller last read or wrote it
    (``read_checkpoint_and_hint``), when nothing else wrote the file since (the WAL holding
    the directory): the file is then not read again. Returns the newest slot once written
    (None for the whole-file layout); after an exception the file's state is unknown: pass
    no hint to the next write."""
    if both_slots and not sync:
        raise ValueError("a write into both slots is synced: each slot must be durable before the other is")
    body = json.dumps({"version": _VERSION, **state}, sort_keys=True).encode()
    final = os.path.join(directory, name)
    if not in_place or len(body) > _SLOT_BODY_MAX:
        _replace_file(fs, final, json.dumps({"crc32c": crc32c(body), "body": body.decode()}).encode())
        return None
    if hint is None:
        hint = _hint(fs.read_all(final)) if fs.exists(final) else None
    if hint is None or hint[1] >= _SEQUENCE_LAST - 2:
        # None yet, the whole-file layout, no slot readable (or a sequence about to run
        # out, which only a hostile file reaches): a new file.
        _replace_file(fs, final, _slot(1, body) + _slot(2, body))
        return 1, 2
    index, sequence = hint
    handle = fs.open_rw(final)
    try:
        if presync:
            handle.sync()
        for _ in range(2 if both_slots else 1):
            index, sequence = 1 - index, sequence + 1
            handle.pwrite([_slot(sequence, body)], index * SLOT_BYTES)
            if sync:
                handle.sync()
    finally:
        handle.close()
    return index, sequence


def _replace_file(fs: FileSystem, final: str, blob: bytes) -> None:
    """Temp file -> fsync -> rename -> fsync(dir): ``final`` is the old file or ``blob``."""
    directory = os.path.dirname(final)
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


def _slot(sequence: int, body: bytes) -> bytes:
    head = _SLOT_HEAD.pack(sequence, len(body))
    raw = SLOT_MAGIC + head + crc32c(head + body).to_bytes(4, "little") + body
    return raw + bytes(SLOT_BYTES - len(raw))


def _read_slot(raw: bytes) -> tuple[int, CheckpointState] | None:
    """(sequence, state) of a valid slot; None for a blank, torn or rotted one, or one whose
    body this code cannot read (a later version, hostile bytes)."""
    if len(raw) != SLOT_BYTES or raw[:len(SLOT_MAGIC)] != SLOT_MAGIC:
        return None
    head = raw[len(SLOT_MAGIC):len(SLOT_MAGIC) + _SLOT_HEAD.size]
    sequence, length = _SLOT_HEAD.unpack(head)
    if length > _SLOT_BODY_MAX:
        return None
    body = raw[_SLOT_BODY_START:_SLOT_BODY_START + length]
    if crc32c(head + body) != int.from_bytes(raw[_SLOT_BODY_START - 4:_SLOT_BODY_START], "little"):
        return None
    try:
        return sequence, _decode_body(body)
    except _UNREADABLE as exc:
        _log.warning("ignoring a checkpoint slot (sequence %d) that cannot be read: %s", sequence, exc)
        return None


def _decode_body(body: bytes) -> CheckpointState:
    """The state a body holds; ValueError (or another of ``_UNREADABLE``) for one this code
    cannot use: another version, or a field readers convert that is not a whole number."""
    state = json.loads(body)
    if not isinstance(state, dict):
        raise ValueError("the checkpoint is not a JSON object")
    if state.get("version") != _VERSION:
        raise ValueError(f"unknown checkpoint version {state.get('version')!r}")
    for name in _OFFSET_FIELDS:
        value = state.get(name, 0)
        if type(value) is not int or not 0 <= value <= _OFFSET_LAST:
            raise ValueError(f"checkpoint field {name} is {value!r}, not an offset")
    if not isinstance(state.get("topic", ""), str):
        raise ValueError("checkpoint field topic is not a string")
    return state


#: What reading a damaged or hostile body raises (RecursionError: nested too deep).
_UNREADABLE = (ValueError, KeyError, TypeError, AttributeError, RecursionError)


def _is_slotted(data: bytes) -> bool:
    """The two-slot layout: a slot's magic where either slot starts (whatever the length: a
    torn write may leave garbage past the end; only a whole file is written in place)."""
    return SLOT_MAGIC in (data[:len(SLOT_MAGIC)], data[SLOT_BYTES:SLOT_BYTES + len(SLOT_MAGIC)])


def _newest_slot(data: bytes) -> tuple[int, int, CheckpointState] | None:
    """(slot index, sequence, state) of the valid slot with the highest sequence, or None.
    The reader takes it, and a write goes into the other slot: the same choice, so a torn
    write never touches the slot a reader would fall back to."""
    if not _is_slotted(data):
        return None
    found = [(slot[0], index, slot[1]) for index in (0, 1)
             if (slot := _read_slot(data[index * SLOT_BYTES:(index + 1) * SLOT_BYTES])) is not None]
    if not found:
        return None
    sequence, index, state = max(found, key=lambda f: (f[0], f[1]))
    return index, sequence, state


def _hint(data: bytes) -> SlotHint | None:
    """Where an in-place write of ``data`` (a whole file) goes from: its newest slot, if it
    is a whole two-slot file with a valid one."""
    newest = _newest_slot(data) if len(data) == 2 * SLOT_BYTES else None
    return None if newest is None else (newest[0], newest[1])


def read_checkpoint(fs: FileSystem, directory: str, name: str = CHECKPOINT_NAME) -> CheckpointState | None:
    """The last checkpoint, or None when there is none or it is unreadable (it is advisory)."""
    return read_checkpoint_and_hint(fs, directory, name)[0]


def read_checkpoint_and_hint(fs: FileSystem, directory: str,
                             name: str = CHECKPOINT_NAME) -> tuple[CheckpointState | None, SlotHint | None]:
    """``read_checkpoint``, and the hint a write of the same file may be given next
    (``write_checkpoint``): None where that write has to read the file itself."""
    path = os.path.join(directory, name)
    if not fs.exists(path):
        return None, None
    try:
        data = fs.read_all(path)
        if _is_slotted(data):
            newest = _newest_slot(data)
            if newest is None:
                raise ValueError("no slot of the checkpoint is valid")
            return newest[2], _hint(data)
        outer = json.loads(data)
        body = outer["body"].encode()
        if crc32c(body) != outer["crc32c"]:
            raise ValueError("checkpoint CRC mismatch")
        return _decode_body(body), None
    except _UNREADABLE as exc:
        _log.warning("ignoring unreadable WAL checkpoint %s: %s", path, exc)
        return None, None
