"""The scrubber: prove a topic's archive and local WAL are continuous and intact.

``verify_topic`` reads only; it never repairs. It checks, in order:

1. descriptors parse, and are contiguous and non-overlapping from the archive start
   (``keys.ArchiveStart``, 0 when archive retention never cut anything): the first
   descriptor at or above it must begin exactly there (a hole at the start is a ``gap``
   like any other), and there is no hole and no overlap after it. Descriptors wholly
   below the start are an interrupted retention cut's leftovers: one ``retention_pending``
   warning, their objects not checked (the owner's next retention run deletes them);
2. every object a descriptor names exists, passes its CRCs, and holds exactly the
   descriptor's offsets (first, last, count, each frame's offset = previous + 1);
   Every object must also be the one its descriptor pins: its exact ``size`` and its
   content digest (``footer_crc32c``, ``block_crc32c``);
3. the sealed state, when the topic is sealed and nobody holds it, names the last
   descriptor's end offset (``null`` only with no descriptors); a sealed or open state
   never names an offset past the archive's end; the owner record parses.
   Descriptors, sealed state, owner and lost ranges are read in ONE metadata read (one
   range over the topic's storage prefix: one revision on etcd, one transaction on
   SQLite), so a verify that overlaps a move sees a consistent picture;
4. the local WAL, if this host has one for the topic, is itself contiguous and
   continues right after the archive (its first offset is at most archive end + 1).
   Rounds its root's shared journal still holds are laid over its segments, as replay
   would lay them; while a healthy commit group runs on the root, its replay done
   (``wal.journal.journal_running``), the segments must also equal the journal's copy of
   those rounds (it writes a round to its segment before journaling it), so bit rot there
   is found before a checkpoint drops the copy;
5. subscription cursors do not point past the last offset the topic has;
6. objects under the topic's prefix that no descriptor names are listed as orphans
   (a crash between an object PUT and its descriptor commit leaves one);
7. lost ranges (failovers, ``keys.LostRange``) are listed: offsets a dead owner made
   durable but never archived, reassigned since. A reported loss is a ``warning`` (the
   archive itself is fine); a malformed record is an error.

Each problem is a dict with a ``severity`` (``error``, or ``warning`` for an orphan past
the archive's end, which may be an upload between its PUT and its commit; ``ok`` is
false only for errors), a stable ``kind`` (``malformed``, ``gap``, ``overlap``,
``missing_object``, ``corrupt_object``, ``size_mismatch``, ``digest_mismatch``,
``range_mismatch``, ``sealed_mismatch``, ``retention_pending``, ``cursor_below_retention``,
``wal_gap``, ``wal_corrupt``, ``wal_behind_published_tip``, ``cursor_ahead``, ``orphan``,
``lost_range``) and a ``message`` saying
what and where, plus the offsets or keys involved.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tiered.archive import fetch
from tiered.archive.chain import decode_descriptor
from tiered.archive.fetch import ObjectMismatch, ObjectPin
from tiered.archive.naming import descriptor_object_key
from tiered.archive.orphans import find_orphans
from tiered.archive.start import incarnation_start
from tiered.errors import InvalidKey, MalformedRecord, ObjectNotFound
from tiered.lifecycle.ownership import OwnerRecord
from tiered.metadata import keys
from wal.errors import CorruptLog
from wal.fs import RealFs
from wal.topics import TopicName

#: No dnb1 object is larger (S3's own object limit is 5 TiB): a descriptor naming more is
#: not a real object, whatever the store says.
DESCRIPTOR_SIZE_MAX_BYTES = 5 << 40

T = TypeVar("T")
#: ``progress(items, total, label)`` wraps an iterable (the CLI draws a bar with it).
Progress = Callable[[Iterable[T], "int | None", str], Iterable[T]]


@dataclass
class VerifyReport:
    topic: str
    problems: list[dict[str, Any]] = field(default_factory=list)
    descriptors: int = 0
    objects_checked: int = 0
    archive_first_offset: int | None = None
    #: The archive start (first retained offset: past the last cut and the incarnation's first offset).
    archive_start: int = 0
    archive_cut: bool = False  # archive retention moved the start (past the incarnation's first offset)
    archive_last_offset: int | None = None
    wal_first_offset: int | None = None
    wal_last_offset: int | None = None
    orphans: list[str] = field(default_factory=list)
    lost_ranges: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(p["severity"] == "error" for p in self.problems)

    def add(self, kind: str, message: str, severity: str = "error", **details: Any) -> None:
        self.problems.append({"kind": kind, "severity": severity, "message": message, **details})

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON contract: exactly ``ok`` and ``problems``."""
        return {"ok": self.ok, "problems": self.problems}


def verify_topic(topic: TopicName | str, metadata: Any, objects: Any, wal_dir: str | None = None,
                 progress: Progress | None = None, check_objects: bool = True) -> VerifyReport:
    """Scrub one topic; ``wal_dir`` is the WAL root of the host whose local WAL to check."""
    name = TopicName.parse(topic)
    report = VerifyReport(str(name))
    # A live broker's WAL and archive both only move forward: its WAL is scanned before
    # the archive's end is read (the end read after is at least the end when the WAL's
    # first offset was taken, so a healthy WAL never shows a gap), and the durable tip it
    # published is read before the scan (a tip never passes the WAL it was taken from).
    # Cursors are read first of all: a cursor only acknowledges offsets that existed when
    # it was written, so none read now can pass an end read later.
    cursors = metadata.range(keys.subscriptions_prefix(name))
    local = _LocalWal.scan(name, wal_dir, metadata, report) if wal_dir is not None else None
    snapshot = _Snapshot.read(name, metadata)
    report.archive_start = _archive_start(snapshot, report)
    descriptors = _retained(_load_descriptors(snapshot, report), report)
    _check_chain(descriptors, report)
    if check_objects:
        _check_objects(name, descriptors, objects, report, progress or _no_progress, metadata)
    _check_sealed_state(snapshot, report)
    if local is not None:
        _check_local_wal(local, report, snapshot)
    _check_cursors(cursors, report, _sealed_end(snapshot))
    _check_orphans(name, metadata, objects, report)
    _list_lost_ranges(snapshot, report)
    return report


@dataclass
class _Snapshot:
    """The topic's storage records as of ONE metadata read (one revision)."""

    topic: TopicName
    descriptors: list[Any]
    state: Any
    owner: Any
    lost: list[Any]
    start: Any = None
    tombstone: Any = None

    @classmethod
    def read(cls, topic: TopicName, metadata: Any) -> "_Snapshot":
        objects, lost = keys.objects_prefix(topic), keys.lost_prefix(topic)
        snapshot = cls(topic, [], None, None, [])
        for kv in metadata.range(keys.storage_prefix(topic)):
            if kv.key.startswith(objects):
                snapshot.descriptors.append(kv)
            elif kv.key.startswith(lost):
                snapshot.lost.append(kv)
            elif kv.key == keys.state_key(topic):
                snapshot.state = kv
            elif kv.key == keys.owner_key(topic):
                snapshot.owner = kv
            elif kv.key == keys.archive_start_key(topic):
                snapshot.start = kv
            elif kv.key == keys.tombstone_key(topic):
                snapshot.tombstone = kv
        return snapshot


def _no_progress(items: Iterable[T], total: int | None, label: str) -> Iterable[T]:
    return items


# -- 1. descriptor chain --------------------------------------------------------------

def _load_descriptors(snapshot: _Snapshot, report: VerifyReport) -> list[keys.ObjectDescriptor]:
    found = []
    for kv in snapshot.descriptors:
        try:
            descriptor = decode_descriptor(kv.key, kv.value)
        except MalformedRecord as e:
            report.add("malformed", str(e), key=kv.key)
            continue
        if descriptor.size > DESCRIPTOR_SIZE_MAX_BYTES:
            report.add("malformed", f"descriptor {kv.key} names an object of {descriptor.size} bytes, more "
                                    f"than any object can be ({DESCRIPTOR_SIZE_MAX_BYTES})", key=kv.key)
        found.append(descriptor)
    found.sort(key=lambda d: (d.start_offset, d.end_offset))
    report.descriptors = len(found)
    if found:
        report.archive_first_offset = found[0].start_offset
        report.archive_last_offset = max(d.end_offset for d in found)
    return found


def _archive_start(snapshot: _Snapshot, report: VerifyReport) -> int:
    """What :func:`tiered.archive.start.archive_start` says, from the snapshot: past the
    last cut and at or past the incarnation's first offset (a re-created topic's numbering
    continues past the deleted incarnation's: offsets below are gone by decision)."""
    cut = incarnation = 0
    try:
        if snapshot.start is not None:
            cut = keys.ArchiveStart.from_json(snapshot.start.key, snapshot.start.value).first_offset
    except MalformedRecord as e:
        report.add("malformed", str(e), key=snapshot.start.key)
    try:
        if snapshot.tombstone is not None:
            kv = snapshot.tombstone
            incarnation = incarnation_start(keys.TopicTombstone.from_json(kv.key, kv.value))
    except MalformedRecord as e:
        report.add("malformed", str(e), key=snapshot.tombstone.key)
    report.archive_cut = cut > incarnation
    return max(cut, incarnation)


def _retained(descriptors: list[keys.ObjectDescriptor], report: VerifyReport) -> list[keys.ObjectDescriptor]:
    """The descriptors from the archive start on; the ones wholly below it are reported
    once (a retention cut interrupted between its steps) and left out of every check."""
    start = report.archive_start
    below = [d for d in descriptors if d.end_offset < start]
    kept = [d for d in descriptors if d.end_offset >= start]
    if below:
        report.add("retention_pending", f"{len(below)} descriptor(s) of offsets {below[0].start_offset}-"
                                        f"{below[-1].end_offset} lie below the archive start {start}: a retention "
                                        "cut not finished yet (the owner's next retention run deletes them; "
                                        "no reader serves them)", severity="warning",
                   first_offset=below[0].start_offset, last_offset=below[-1].end_offset)
    if kept:
        report.archive_first_offset = max(start, kept[0].start_offset)
        if kept[0].start_offset < start:
            # A cut's start is always a descriptor boundary: a restore refuses this chain.
            report.add("overlap", f"object {kept[0].start_offset}-{kept[0].end_offset} begins below the archive "
                                  f"start {start}: the start is not an object boundary (a load's restore refuses "
                                  "this chain as broken)", first_offset=kept[0].start_offset, last_offset=start - 1)
        if kept[0].start_offset > start:
            report.add("gap", f"offsets {start}-{kept[0].start_offset - 1} are in no object (the archive "
                              f"starts at {start}, its first object at {kept[0].start_offset})",
                       first_offset=start, last_offset=kept[0].start_offset - 1)
    elif report.archive_cut:  # a cut never removes the tip (a new incarnation may have no object yet)
        report.add("gap", f"the archive starts at {start} but no object holds it or anything after it",
                   first_offset=start, last_offset=None)
    report.descriptors = len(kept)
    return kept


def _check_chain(descriptors: list[keys.ObjectDescriptor], report: VerifyReport) -> None:
    for prev, cur in zip(descriptors, descriptors[1:]):
        expected = prev.end_offset + 1
        if cur.start_offset > expected:
            report.add("gap", f"offsets {expected}-{cur.start_offset - 1} are in no object "
                              f"(object {prev.start_offset}-{prev.end_offset} is followed by "
                              f"{cur.start_offset}-{cur.end_offset})",
                       first_offset=expected, last_offset=cur.start_offset - 1)
        elif cur.start_offset < expected:
            report.add("overlap", f"objects {prev.start_offset}-{prev.end_offset} and "
                                  f"{cur.start_offset}-{cur.end_offset} both hold offsets "
                                  f"{cur.start_offset}-{min(prev.end_offset, cur.end_offset)}",
                       first_offset=cur.start_offset, last_offset=min(prev.end_offset, cur.end_offset))


# -- 2. objects -----------------------------------------------------------------------

def _cut_meanwhile(topic: TopicName, desc: keys.ObjectDescriptor, metadata: Any) -> bool:
    """Whether the descriptor read in the snapshot is gone now, below the archive start:
    a retention cut ran during the object check (it deletes descriptors, then objects)."""
    from tiered.archive.start import archive_start

    try:
        if metadata.get(keys.descriptor_key(topic, desc.start_offset)) is not None:
            return False
        return desc.end_offset < archive_start(metadata, topic)
    except (MalformedRecord, ValueError):
        return False  # reported elsewhere; the object counts as missing


def _check_objects(topic: TopicName, descriptors: list[keys.ObjectDescriptor], objects: Any,
                   report: VerifyReport, progress: Progress, metadata: Any) -> None:
    for desc in progress(descriptors, len(descriptors), "verifying objects"):
        try:
            key = descriptor_object_key(topic, desc)
        except ValueError as e:
            report.add("malformed", f"descriptor {desc.start_offset}-{desc.end_offset}: {e}",
                       first_offset=desc.start_offset)
            continue
        try:
            data = objects.get(key)
        except ObjectNotFound:
            if _cut_meanwhile(topic, desc, metadata):
                continue  # archive retention removed it after the snapshot: nothing is missing
            report.add("missing_object", f"object {key} of offsets {desc.start_offset}-{desc.end_offset} "
                                         "does not exist", key=key)
            continue
        except InvalidKey as e:  # e.g. a symlink out of a local store: damage, not the operator's input
            report.add("corrupt_object", f"object {key} of offsets {desc.start_offset}-{desc.end_offset} "
                                         f"cannot be read: {e}", key=key)
            continue
        report.objects_checked += 1
        _check_object_bytes(topic, key, desc, data, report)


def _check_object_bytes(topic: TopicName, key: str, desc: keys.ObjectDescriptor, data: bytes,
                        report: VerifyReport) -> None:
    try:
        offsets = frame_offsets(fetch.read_whole_object(key, data, ObjectPin.of(desc), topic))
    except ObjectMismatch as e:
        if e.what == "size":
            report.add("size_mismatch", f"object {key} is {len(data)} bytes, its descriptor says {desc.size}: "
                                        "not the object that was committed", key=key, size=len(data),
                       descriptor_size=desc.size)
        else:
            report.add("digest_mismatch", f"object {key} is a valid object but not the one its descriptor "
                                          "pins (footer/block CRC32C differ): it was replaced after its commit",
                       key=key)
        return
    except Exception as e:  # noqa: BLE001 - any decode failure is a corrupt object here
        report.add("corrupt_object", f"object {key}: {e}", key=key)
        return
    if not offsets:
        report.add("range_mismatch", f"object {key} holds no messages", key=key)
        return
    if (offsets[0], offsets[-1]) != (desc.start_offset, desc.end_offset):
        report.add("range_mismatch", f"object {key} holds offsets {offsets[0]}-{offsets[-1]} but its "
                                     f"descriptor says {desc.start_offset}-{desc.end_offset}", key=key)


def frame_offsets(frames: bytes) -> list[int]:
    """Every offset a run of validated WAL frames holds, in order (each frame's CRC checked)."""
    import native

    scan = native.scan_frames(frames, 0, None, None, False, True)
    if scan.error is not None:
        raise ValueError(f"frame {scan.error.reason} at byte {scan.error.position} of its frames "
                         f"({scan.error.detail})")
    return list(range(scan.first_offset, scan.last_offset + 1)) if scan.count else []


# -- 3. sealed state ------------------------------------------------------------------

def _check_sealed_state(snapshot: _Snapshot, report: VerifyReport) -> None:
    _holder(snapshot, report)  # reports a malformed owner record
    kv = snapshot.state
    if kv is None:
        return
    try:
        state = keys.SealedState.from_json(kv.key, kv.value)
    except MalformedRecord as e:
        report.add("malformed", str(e), key=kv.key)
        return
    last, named = report.archive_last_offset, state.last_committed_offset
    if last is None and report.archive_start > 0:
        last = report.archive_start - 1  # a re-created topic with nothing archived yet ends there
    if named is not None and (last is None or named > last):
        report.add("sealed_mismatch", f"{'sealed' if state.sealed else 'open'} state names offset {named}, "
                                      f"beyond the archive's end {_fmt(last)}", sealed=named, archive=last)
        return
    # Sealed: the seal must name exactly the archive's end, whoever holds the topic now. A
    # new holder marks the topic open before its uploader starts, so while the state still
    # says sealed nothing was archived past it (and a restore refuses any other end).
    if state.sealed and named != last:
        report.add("sealed_mismatch", f"sealed state says last_committed_offset={_fmt(named)} but the "
                                      f"last object ends at {_fmt(last)}", sealed=named, archive=last)


def _holder(snapshot: _Snapshot, report: VerifyReport) -> tuple[str | None, bool]:
    """(who holds the topic, whether the owner record parsed); a garbage record is a problem."""
    kv = snapshot.owner
    if kv is None:
        return None, True
    try:
        return OwnerRecord.decode(kv.key, kv.value).holder, True
    except (MalformedRecord, ValueError) as e:
        report.add("malformed", f"owner record: {e}", key=kv.key)
        return None, False


def _fmt(offset: int | None) -> str:
    return "null" if offset is None else str(offset)


# -- 4. local WAL ---------------------------------------------------------------------

@dataclass
class _LocalWal:
    """This host's local WAL of the topic as scanned (read-only), with the progress
    record as it was just before the scan."""

    directory: str
    first: int | None
    last: int | None
    progress: Any = None

    @classmethod
    def scan(cls, topic: TopicName, wal_dir: str, metadata: Any, report: VerifyReport) -> "_LocalWal | None":
        directory = os.path.join(wal_dir, topic.path)
        if not os.path.isdir(directory):
            return None
        progress = metadata.get(keys.progress_key(topic))
        first, last = _scan_wal(directory, report)
        return cls(directory, first, last, progress)


def _check_local_wal(local: _LocalWal, report: VerifyReport, snapshot: _Snapshot | None = None) -> None:
    first, last = local.first, local.last
    report.wal_first_offset, report.wal_last_offset = first, last
    archive_end = report.archive_last_offset
    if first is None or last is None:
        return
    if snapshot is not None:
        _check_published_tip(local, last, snapshot, report)
    if archive_end is None:
        # Nothing archived: the WAL holds the topic from where the archive would start
        # (retention removes only archived segments), else a load finds it does not join.
        archive_end = report.archive_start - 1
    if first > archive_end + 1:
        report.add("wal_gap", f"the local WAL starts at {first} but the archive ends at {archive_end}: "
                              f"offsets {archive_end + 1}-{first - 1} are nowhere",
                   first_offset=archive_end + 1, last_offset=first - 1)


def _check_published_tip(local: _LocalWal, last: int, snapshot: _Snapshot, report: VerifyReport) -> None:
    """The rule a load applies before recovering a WAL (``BrokerHost._published_past``),
    read-only: the epoch that wrote this WAL (its ``.owner`` marker, or the open state
    naming its ``.walid``) published a durable tip past the WAL's last offset, and no
    record accounts for that history's loss: acknowledged messages are missing from it
    (a data dir restored from an older copy). The progress record was read before the WAL
    was scanned, and a live WAL only grows, so a running broker never trips this."""
    from tiered.lifecycle.restore import Progress
    from tiered.lifecycle.retire import loss_decided
    from tiered.lifecycle.wal_root import OWNER_MARKER, ROOT_IDENTITY, decode_marker
    from wal.identity import read_wal_id

    directory = local.directory
    if local.progress is None:
        return
    try:
        progress = Progress.decode(local.progress.key, local.progress.value)
    except MalformedRecord as e:
        report.add("malformed", str(e), key=local.progress.key)
        return
    if progress.durable_offset is None or progress.durable_offset <= last:
        return
    try:
        marker = decode_marker(RealFs().read_all(os.path.join(directory, OWNER_MARKER)))
    except OSError:
        marker = None
    if marker is not None:
        written_by = (marker.get("broker_id"), marker.get("epoch"))
    else:
        state = None
        try:
            state = None if snapshot.state is None else keys.SealedState.from_json(snapshot.state.key,
                                                                                  snapshot.state.value)
        except MalformedRecord:
            pass  # reported by the sealed-state check
        local_id = read_wal_id(RealFs(), directory)
        if state is not None and not state.sealed and state.wal_id is not None and local_id is not None \
                and local_id.hex() == state.wal_id:
            written_by = (state.broker_id, state.epoch)
        else:
            # Nothing says which history this WAL is: a load holds it to the tip its
            # broker (the WAL root's ``.broker``) published last, and so does this.
            try:
                root = decode_marker(RealFs().read_all(os.path.join(os.path.dirname(os.path.dirname(directory)),
                                                                    ROOT_IDENTITY)))
            except OSError:
                root = None
            if root is None or local_id is not None:
                return  # an id that reads names another WAL than the open one: not this history
            written_by = (root.get("broker_id"), progress.epoch)
    if written_by != (progress.broker_id, progress.epoch):
        return
    inherits: tuple[tuple[str, int], ...] = ()
    try:
        inherits = () if snapshot.owner is None else OwnerRecord.decode(snapshot.owner.key, snapshot.owner.value).inherits
    except (MalformedRecord, ValueError):
        pass  # reported by the holder check
    lost: list[keys.LostRange] = []
    for kv in snapshot.lost:
        try:
            lost.append(keys.LostRange.from_json(kv.key, kv.value))
        except MalformedRecord:
            continue  # reported with the lost ranges
    if loss_decided(lost, inherits, progress.broker_id, progress.epoch):
        return  # that history's loss is recorded: the load's rule, read-only
    report.add("wal_behind_published_tip",
               f"the local WAL ends at {last}, but epoch {progress.epoch} of broker {progress.broker_id}, which "
               f"wrote it, published offset {progress.durable_offset} as durable: acknowledged offsets "
               f"{last + 1}-{progress.durable_offset} are missing from it (a data dir restored from an older "
               f"copy?); a load refuses it", first_offset=last + 1, last_offset=progress.durable_offset,
               path=directory)


def local_wal_range(wal_dir: str, topic: TopicName | str) -> tuple[int | None, int | None]:
    """(first, last) offset of a topic's local WAL, read-only; (None, None) without one."""
    directory = os.path.join(wal_dir, TopicName.parse(topic).path)
    if not os.path.isdir(directory):
        return None, None
    return _scan_wal(directory, VerifyReport(str(topic)))


#: Scans of a WAL that changed while it was read (a live broker) before its problems count.
WAL_SCAN_ATTEMPTS = 5


def _scan_wal(directory: str, report: VerifyReport) -> tuple[int | None, int | None]:
    """Recovery's own checks (``wal.recovery.validate``), reading only: never open the WAL,
    which would repair its tail. A WAL root's shared journal may hold rounds whose segment
    bytes were not synced yet (a crash before its replay): they are laid over the segments
    as replay would. Returns the offsets recovery would find, (None, None) when it would
    refuse the WAL (reported) or the WAL holds nothing.

    A live broker changes what is read underneath: WAL retention or a seal deletes the
    oldest segments and rewrites the checkpoint, the journal's checkpointer recycles its
    files. A scan that found a problem while the WAL or the journal changed says nothing,
    so it is made again (up to :data:`WAL_SCAN_ATTEMPTS`); a problem counts when the files
    stood still during the scan that found it, or every attempt found one. A WAL directory
    that is gone (sealed and deleted meanwhile) holds nothing."""
    scratch = VerifyReport(report.topic)
    found: tuple[int | None, int | None] = (None, None)
    for _attempt in range(WAL_SCAN_ATTEMPTS):
        if not os.path.isdir(directory):
            return None, None
        before = _scan_signature(directory)
        scratch = VerifyReport(report.topic)
        try:
            found = _scan_wal_once(directory, scratch)
        except OSError as e:  # a journal file recycled under the read
            scratch.add("wal_corrupt", f"{directory}: {e}", path=directory)
            found = (None, None)
        if not scratch.problems or _scan_signature(directory) == before:
            break
    report.problems.extend(scratch.problems)
    return found


def _scan_signature(directory: str) -> tuple[object, ...]:
    """What a live broker changes in a WAL directory and its root's journal (listings,
    checkpoints, journal files' sizes and times; an active segment's appends aside)."""
    from native.journal_format import JOURNAL_DIR

    def listing(path: str, stat: bool) -> object:
        try:
            names = sorted(os.listdir(path))
        except OSError:
            return None
        if not stat:
            return names
        out = []
        for name in names:
            try:
                st = os.stat(os.path.join(path, name))
            except OSError:
                continue
            out.append((name, st.st_size, st.st_mtime_ns))
        return out

    def content(path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None

    journal = os.path.join(os.path.dirname(os.path.dirname(directory)), JOURNAL_DIR)
    return (listing(directory, False), content(os.path.join(directory, "wal.ckpt")),
            listing(journal, True), content(os.path.join(journal, "wal.ckpt")))


def _scan_wal_once(directory: str, report: VerifyReport) -> tuple[int | None, int | None]:
    from wal.checkpoint import read_checkpoint
    from wal.identity import has_wal_id_file, read_wal_id
    from wal.journal import journal_running, pending_segment_bytes
    from wal.recovery import validate

    root = os.path.dirname(os.path.dirname(directory))
    try:
        pending = pending_segment_bytes(RealFs(), root, directory)
    except CorruptLog as e:
        report.add("wal_corrupt", f"the shared journal of {root}: {e}", path=root)
        pending = {}
    if has_wal_id_file(RealFs(), directory) and read_wal_id(RealFs(), directory) is None:
        # Recovery refuses a WAL whose id it cannot read (its journal entries name it).
        report.add("wal_corrupt", f"{directory}: its WAL id file does not parse", path=directory)
    try:
        checkpoint = read_checkpoint(RealFs(), directory)
    except Exception as e:  # noqa: BLE001 - a damaged checkpoint is what recovery refuses too
        report.add("wal_corrupt", f"{directory}: checkpoint unreadable: {e}", path=directory)
        checkpoint = None
    replayed = _ReplayedFs(pending, compare=journal_running(root))
    try:
        scanned, found_next = validate(replayed, directory, checkpoint)
    except CorruptLog as e:
        kind = "wal_gap" if "not contiguous" in str(e) else "wal_corrupt"
        report.add(kind, str(e), path=e.path, position=e.position)
        return None, None
    except OSError as e:  # a file recovery cannot read (a directory named like a segment...)
        report.add("wal_corrupt", f"{directory}: {e}", path=directory)
        return None, None
    for path, position in replayed.differing:
        report.add("wal_corrupt", f"{path}: byte {position} differs from the journal's copy of that round although "
                   "the broker is running (a running broker writes a round to its segment before journaling "
                   "it): the file was damaged after it was written. The journal's next checkpoint drops its "
                   "copy, and the next load will refuse this WAL", path=path, position=position)
    holding = [s.segment for s in scanned if s.segment.last_offset >= s.segment.base_offset]
    if not holding or found_next is None:
        return None, None
    return holding[0].base_offset, found_next - 1


class _ReplayedFs(RealFs):
    """The real file system, each segment read with the journal's pending rounds laid over
    it as replay would lay them (``wal.journal.pending_segment_bytes``).

    ``compare`` (a healthy commit group runs on the root, its replay done:
    ``wal.journal.journal_running``): the segment's own bytes must then equal the
    journal's copy wherever both hold a round, as a running group writes each round to its
    segment before journaling it; ``differing`` collects (path, first byte that
    differs, or where the file ends short) where they do not. After a crash they may
    differ legitimately (a power loss keeps any part of an unsynced write: replay
    rewrites it), so a root nobody runs, or whose group is still replaying, is not compared."""

    def __init__(self, pending: dict[str, tuple[int, bytes, int | None]], compare: bool = False) -> None:
        super().__init__()
        self._pending = pending
        self._compare = compare
        self.differing: list[tuple[str, int]] = []

    def read_all(self, path: str) -> bytes:
        from wal.journal import kept_past_journal, replay_marker_key

        data = super().read_all(path)
        if path in self._pending:
            cut, replayed, next_offset = self._pending[path]
            end = cut + len(replayed)
            if self._compare:
                own = data[cut:end]
                if own != replayed:
                    at = next((i for i, (a, b) in enumerate(zip(own, replayed)) if a != b), len(own))
                    self.differing.append((path, cut + at))
            kept = 0 if next_offset is None else kept_past_journal(data[cut:], replayed, next_offset,
                                                                   replay_marker_key(data))
            data = data[:cut] + replayed + data[end:end + kept]
        return data


# -- 5. cursors -----------------------------------------------------------------------

def _sealed_end(snapshot: _Snapshot) -> int | None:
    """The topic's last offset when it is sealed and nobody holds it (-1: sealed empty):
    then nothing exists past the seal anywhere, whichever host verifies. None otherwise."""
    if snapshot.state is None:
        return None
    try:
        state = keys.SealedState.from_json(snapshot.state.key, snapshot.state.value)
    except MalformedRecord:
        return None  # reported by the sealed-state check
    holder, owner_ok = _holder(snapshot, VerifyReport(str(snapshot.topic)))
    if not (state.sealed and holder is None and owner_ok):
        return None
    return -1 if state.last_committed_offset is None else state.last_committed_offset


def _check_cursors(cursors: list[Any], report: VerifyReport, sealed_end: int | None) -> None:
    ends = [o for o in (report.archive_last_offset, report.wal_last_offset, sealed_end) if o is not None]
    if not ends:
        return  # without an archive, a local WAL or a seal we cannot say where the topic ends
    top = max(ends)
    # Unsealed and no local WAL here: the owner's WAL may hold durable offsets past the
    # archive that a cursor legitimately acknowledged, so only a known end is checked.
    known_end = report.wal_first_offset is not None or sealed_end is not None
    for kv in cursors:
        if not kv.key.endswith("/cursor"):
            continue
        try:
            cursor = keys.Cursor.from_json(kv.key, kv.value)
        except MalformedRecord as e:
            report.add("malformed", str(e), key=kv.key)
            continue
        if cursor.last_acked_offset + 1 < report.archive_start:
            report.add("cursor_below_retention", f"{kv.key} resumes at {cursor.last_acked_offset + 1}, below the "
                                                 f"archive start {report.archive_start}: its consumer gets "
                                                 "OffsetBelowRetention and must restart at the first retained "
                                                 "offset", severity="warning", key=kv.key)
        if cursor.last_acked_offset > top and known_end:
            report.add("cursor_ahead", f"{kv.key} acknowledges offset {cursor.last_acked_offset} but the "
                                       f"topic ends at {top}", key=kv.key)


# -- 6. orphans -----------------------------------------------------------------------

def _check_orphans(topic: TopicName, metadata: Any, objects: Any, report: VerifyReport) -> None:
    try:
        orphans = find_orphans(metadata, objects, topic)
    except ValueError as e:  # a malformed descriptor (already reported) stops the orphan scan
        report.add("orphan_scan", f"orphans not checked: {e}", severity="warning")
        return
    for orphan in orphans:
        report.orphans.append(orphan.key)
        if orphan.below_start:
            report.add("orphan", f"object {orphan.key} ({orphan.size} bytes) lies below the archive start "
                                 f"{report.archive_start}: left by an interrupted retention cut, `dnb gc` "
                                 "collects it", severity="warning", key=orphan.key)
        elif orphan.collectable:
            # Garbage, not damage: no descriptor names it, so no reader serves it (a crash
            # between an upload's PUT and its commit leaves one). `dnb gc` deletes it.
            report.add("orphan", f"object {orphan.key} ({orphan.size} bytes, {orphan.age_s:.0f}s old) is named "
                                 "by no descriptor and lies inside the archived range: garbage, `dnb gc` "
                                 "collects it", severity="warning", key=orphan.key)
        else:
            # Past the chain's end it may be an upload between its PUT and its commit (or
            # one the next pass adopts): listed, but not an error of the archive.
            report.add("orphan", f"object {orphan.key} ({orphan.size} bytes) is named by no descriptor yet; "
                                 "it lies past the archive's end (an upload in flight, or left by a crash)",
                       severity="warning", key=orphan.key)


# -- 7. lost ranges -------------------------------------------------------------------

def lost_range_json(record: keys.LostRange) -> dict[str, Any]:
    return {"start_offset": record.start_offset, "end_offset": record.end_offset, "count": record.count,
            "broker_id": record.broker_id, "epoch": record.epoch, "exact": record.exact,
            "quarantine_path": record.quarantine_path, "reported_by": record.reported_by,
            "timestamp": record.timestamp}


def _list_lost_ranges(snapshot: _Snapshot, report: VerifyReport) -> None:
    for kv in snapshot.lost:
        try:
            record = keys.LostRange.from_json(kv.key, kv.value).check_key(kv.key)
        except MalformedRecord as e:
            report.add("malformed", str(e), key=kv.key)
            continue
        report.lost_ranges.append(lost_range_json(record))
        if record.exact and record.end_offset is None:
            continue  # the dead owner came back and confirmed it held nothing unarchived
        what = (f"offsets {record.start_offset}-{record.end_offset} ({record.count})" if record.exact else
                f"at least {record.count} offset(s) from {record.start_offset}"
                + ("" if record.end_offset is None else f" (to {record.end_offset} or beyond)"))
        where = (f"; its WAL is quarantined at {record.quarantine_path}" if record.quarantine_path else
                 "" if record.exact else "; exact once that broker comes back with its disk")
        report.add("lost_range", f"failover at {record.start_offset}: {what} were durable on broker "
                                 f"{record.broker_id} (epoch {record.epoch}) but never archived, and are "
                                 f"reassigned{where}", severity="warning", key=kv.key,
                   first_offset=record.start_offset, last_offset=record.end_offset, exact=record.exact)
