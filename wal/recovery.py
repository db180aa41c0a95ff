"""Recovery on open: validate every segment, then repair a torn tail.

Nothing is changed on disk until every segment has been validated, so a log that is
refused (CorruptLog) is left exactly as it was found.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from native.format import SEGMENT_VERSION
from wal.checkpoint import CheckpointState
from wal.errors import CorruptLog, InitialOffsetMismatch
from wal.fs import FileSystem
from wal.segment import ScannedSegment, Segment, create_segment, is_temp_name, parse_segment_name, scan_segment

_log = logging.getLogger(__name__)


@dataclass
class Recovered:
    segments: list[Segment]  # ascending, contiguous; the last one is active
    next_offset: int
    repaired_bytes: int  # bytes of torn tail cut from the last segment


def recover(fs: FileSystem, directory: str, checkpoint: CheckpointState | None, initial_offset: int | None,
            index_interval_bytes: int) -> Recovered:
    names = _remove_temp_files(fs, directory)
    scanned, found_next = validate(fs, directory, checkpoint, index_interval_bytes, names)
    segments = [s.segment for s in scanned]
    next_offset = found_next if segments else checkpoint_next(checkpoint)
    segments, next_offset = _apply_initial_offset(fs, directory, segments, next_offset, checkpoint,
                                                  initial_offset)
    repaired = _repair_tail(fs, scanned[-1] if scanned else None)
    segments = _upgrade_empty_tail(fs, directory, segments)
    for segment in segments[:-1]:
        segment.sealed = True
    return Recovered(segments, next_offset, repaired)


def validate(fs: FileSystem, directory: str, checkpoint: CheckpointState | None,
             index_interval_bytes: int = 4096,
             listing: list[str] | None = None) -> tuple[list[ScannedSegment], int | None]:
    """Recovery's checks, reading only: every segment recovery knows (20-digit names; temp
    files are never durable), its header, frames and tail rule, contiguity across segments,
    and the checkpoint's rules. Returns the scanned segments (a torn tail is reported in
    ``truncate_to``, not cut) and the next offset they reach (None without segments);
    raises CorruptLog where recovery would refuse. Read-only checkers (``dnb verify``) call
    it so they can never disagree with a recovery. ``listing``: the directory's names, if
    the caller just listed it."""
    names = _segment_names(fs.listdir(directory) if listing is None else listing)
    scanned = [
        scan_segment(fs, os.path.join(directory, name), base, i == len(names) - 1, index_interval_bytes)
        for i, (base, name) in enumerate(names)
    ]
    segments = [s.segment for s in scanned]
    _check_contiguous(segments)
    found_next = segments[-1].last_offset + 1 if segments else None
    _check_against_checkpoint(directory, segments, found_next, checkpoint)
    return scanned, found_next


def _remove_temp_files(fs: FileSystem, directory: str) -> list[str]:
    """Temp files were never renamed into place, so nothing durable refers to them.
    Returns the directory's other names."""
    kept = []
    for name in fs.listdir(directory):
        if is_temp_name(name):
            _log.info("removing leftover temp file %s", name)
            fs.remove(os.path.join(directory, name))
        else:
            kept.append(name)
    return kept


def _segment_names(listing: list[str]) -> list[tuple[int, str]]:
    found = []
    for name in listing:
        base = parse_segment_name(name)
        if base is not None:
            found.append((base, name))
    return sorted(found)


def _check_contiguous(segments: list[Segment]) -> None:
    for previous, current in zip(segments, segments[1:]):
        if current.base_offset != previous.last_offset + 1:
            raise CorruptLog(current.path, 0, f"segment starts at {current.base_offset} but the previous "
                             f"one ends at {previous.last_offset}: offsets are not contiguous")


def checkpoint_next(checkpoint: CheckpointState | None) -> int | None:
    """How far ``checkpoint`` says the log reached (None without one): every offset below
    it is durable, and recovery refuses a log that ends before it."""
    if checkpoint is None:
        return None
    return max(int(checkpoint.get("next_offset", 0)), int(checkpoint.get("sealed_next_offset", 0)))


def _check_against_checkpoint(directory: str, segments: list[Segment], next_offset: int | None,
                              checkpoint: CheckpointState | None) -> None:
    """Missing whole segments means lost durable data: refuse rather than reuse offsets.

    The checkpoint names the active segment (``sealed_next_offset`` is its base) and how
    far the log reached when it was written. Losing the tail of the active segment is a
    torn write the tail rule repairs; losing a sealed segment, or the active segment file
    while it held records, is not.
    """
    if checkpoint is None:
        return
    if not segments:
        # Retention always keeps the active segment, and a delete removes the checkpoint
        # first (wal.fs.crash_safe_order): a checkpoint that retained offsets while no
        # segment is left lost every one of them.
        first = int(checkpoint.get("first_offset", 0))
        reached = max(int(checkpoint.get("next_offset", 0)), int(checkpoint.get("sealed_next_offset", 0)))
        if reached > first:
            raise CorruptLog(directory, 0, f"no segment is left, but the checkpoint retains offsets from {first} "
                             f"to {reached - 1} (segments missing?)")
        return
    # Retention (truncate_before) records the new first offset before it unlinks anything,
    # so a log that now starts later than the checkpoint's first offset lost its oldest files.
    checkpoint_first = checkpoint.get("first_offset")
    if segments and checkpoint_first is not None and segments[0].base_offset > int(checkpoint_first):
        raise CorruptLog(directory, 0, f"log starts at offset {segments[0].base_offset}, but the "
                         f"checkpoint retains from {checkpoint_first} (oldest segments missing?)")
    sealed_next = int(checkpoint.get("sealed_next_offset", 0))
    checkpoint_next = int(checkpoint.get("next_offset", 0))
    # The checkpoint only ever records durable offsets, so a tail repair that would cut
    # below its next_offset would drop data proven synced (and reuse its offsets).
    if segments and next_offset is not None and next_offset < checkpoint_next:
        raise CorruptLog(segments[-1].path, segments[-1].size_bytes,
                         f"log ends at offset {next_offset - 1} after repair, but the checkpoint "
                         f"recorded offsets up to {checkpoint_next - 1} as durable")
    if next_offset is not None and next_offset < sealed_next:
        raise CorruptLog(directory, 0, f"log ends before offset {sealed_next}, which the checkpoint "
                         f"says was sealed durably (segments missing?)")
    active_present = any(s.base_offset == sealed_next for s in segments)
    if checkpoint_next > sealed_next and not active_present and (next_offset or 0) < checkpoint_next:
        raise CorruptLog(directory, 0, f"segment {sealed_next} held offsets up to {checkpoint_next - 1} "
                         f"per the checkpoint but is missing")


def _apply_initial_offset(fs: FileSystem, directory: str, segments: list[Segment], next_offset: int | None,
                          checkpoint: CheckpointState | None, initial_offset: int | None) -> tuple[list[Segment], int]:
    if next_offset is None:  # a brand-new WAL: the restore path of a topic move starts here
        start = 0 if initial_offset is None else initial_offset
        if start < 0:
            raise ValueError(f"initial_offset {start} is negative")
        return [create_segment(fs, directory, start)], start
    if initial_offset is not None and initial_offset != next_offset:
        raise InitialOffsetMismatch(initial_offset, next_offset)
    if not segments:  # every segment file is gone but the checkpoint remembers where we were
        _log.warning("%s: no segment files; continuing at checkpoint offset %d", directory, next_offset)
        return [create_segment(fs, directory, next_offset)], next_offset
    return segments, next_offset


def _upgrade_empty_tail(fs: FileSystem, directory: str, segments: list[Segment]) -> list[Segment]:
    """An empty last segment of an older format is replaced by an empty one of the current
    format (same name, create-then-rename), so everything the writer appends is in commit
    rounds with keyed markers. A non-empty old one stays; the writer cuts a new segment
    before its first write."""
    last = segments[-1]
    if last.version >= SEGMENT_VERSION or last.record_count:
        return segments
    _log.info("%s: replacing an empty format-%d segment with a current-format one", last.path,
              last.version)
    return segments[:-1] + [create_segment(fs, directory, last.base_offset)]


def _repair_tail(fs: FileSystem, last: ScannedSegment | None) -> int:
    if last is None or last.truncate_to is None:
        return 0
    cut = last.file_bytes - last.truncate_to
    _log.warning("%s: truncating torn tail of %d bytes at byte %d", last.segment.path, cut, last.truncate_to)
    fs.truncate(last.segment.path, last.truncate_to)
    return cut
