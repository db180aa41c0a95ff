"""Loss records: the ``LostRange`` entries that make every renumbering visible.

When a topic's numbering restarts past offsets some WAL held that were never archived
(a failover from a dead owner, a stale WAL of this broker, a WAL the operator
discarded), those offsets are lost. They are never lost silently: a ``LostRange`` under
``keys.lost_key(topic, start, epoch)`` is written BEFORE the numbering restarts or the
WAL moves, so a crash in between cannot hide the loss.

* the takeover's own account (``exact: false``, at least what the previous owner's
  last published tip says), in the same fenced transaction as the open marker
  (:meth:`LossRecords.unrecorded_histories` picks the histories still unaccounted for);
* the exact account of a stale WAL this broker retires (``exact: true``, end = the
  WAL's tip, with the quarantine path), by compare-and-swap (:meth:`LossRecords.write_lost`);
* the account of an unreadable WAL the operator discarded (``exact: false``, end
  unknown) (:meth:`LossRecords.record_discarded`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from tiered.errors import StorageError
from tiered.metadata import keys
from tiered.metadata.base import MetadataStore, Put, absent, value_is
from tiered.lifecycle.ownership import OwnerRecord, OwnerToken
from tiered.lifecycle.restore import RestorePlan, read_progress, unarchived_by
from tiered.archive import list_descriptors
from tiered.archive.start import archive_start
from tiered.archive.chain import DescriptorChain
from wal.topics import TopicName


@dataclass(frozen=True, slots=True)
class RetiredWal:
    """A stale local WAL this broker let go of: deleted when everything it held was
    archived (``lost_start is None``), else quarantined at ``quarantine_path`` with the
    exact never-archived offsets ``lost_start..lost_end`` recorded as a LostRange."""

    topic: TopicName
    first_offset: int
    last_offset: int | None
    lost_start: int | None
    lost_end: int | None
    epoch: int
    quarantine_path: str | None
    #: It was the history of the owner record this load took over (not an older WAL of
    #: this broker whose history had already been taken over and recorded).
    current: bool = False
    #: The epoch its ``.owner`` marker names (the epoch whose load opened it; None:
    #: unreadable or absent). ``epoch`` is the history its record names, which for a WAL
    #: no takeover record names may come from elsewhere.
    marker_epoch: int | None = None


class LossRecords:
    """The loss records one broker writes and reads about its own histories."""

    def __init__(self, metadata: MetadataStore, broker_id: str) -> None:
        self.metadata = metadata
        self.broker_id = broker_id

    def own_lost_record(self, topic: TopicName, wal_epoch: int | None = None) -> keys.LostRange | None:
        """The failover away from this broker that ended the history of the WAL opened at
        ``wal_epoch`` (its ``.owner`` marker): the first takeover record naming this broker
        at or after that epoch (failed loads of our own bump the epoch without a new WAL,
        so the taker-over's record may name a later one). A record of an earlier epoch
        belongs to an older WAL of this broker and says nothing about this one. Without a
        marker (a WAL from before markers existed): the newest record."""
        mine = [r for r in keys.read_lost_ranges(self.metadata, topic) if r.broker_id == self.broker_id]
        if wal_epoch is None:
            return max(mine, key=lambda r: r.epoch, default=None)
        return min((r for r in mine if r.epoch >= wal_epoch), key=lambda r: r.epoch, default=None)

    def own_record_within(self, topic: TopicName, first: int, tip: int) -> tuple[keys.LostRange | None, bool]:
        """For a WAL whose ``.owner`` marker does not read (``first``..``tip``): the record
        that can be its history's account, the oldest of this broker whose numbering
        restarted inside the WAL or right after it (``first <= start <= tip + 1``: a
        takeover restarts right past the archive, which a WAL's first offset never passes).
        The newest record, what :meth:`own_lost_record` gives without a marker, may be a
        later history of this broker on another data dir: measured against it, this WAL
        was deleted as "all archived" with acknowledged offsets no object held (atk52 F01).
        None when none fits: its own descriptors then account for it. The flag says that
        more than one fits: the pick may be another history's (atk54 F02), so the record
        must not be made exact on its strength."""
        mine = [r for r in keys.read_lost_ranges(self.metadata, topic)
                if r.broker_id == self.broker_id and first <= r.start_offset <= tip + 1
                # "Confirmed: nothing lost from start" (exact, no end) was that history's own
                # WAL holding nothing from there on: a WAL that does is another history's
                # (atk53 F02: an older history that restarted where this WAL begins).
                and not (r.exact and r.end_offset is None and tip >= r.start_offset)]
        return min(mine, key=lambda r: r.epoch, default=None), len(mine) > 1

    def first_unarchived_by_us(self, topic: TopicName, first: int, history: int | None = None) -> tuple[int, int]:
        """Without a LostRange: the first offset from ``first`` on that no descriptor of
        this broker covers, and the newest epoch this broker archived under (0: none).

        Only this broker's own descriptors count. Offsets below the archive start whose
        descriptors retention removed do NOT count as archived by us: some owner archived
        those numbers, not necessarily from this WAL's bytes (a failover may have given
        them to other messages). Where that evidence is gone the caller quarantines the
        WAL and records the range, keeping the bytes, rather than deleting it: a possibly
        false LostRange below the archive start costs an operator a look, a wrong delete
        would lose the only copy of acknowledged messages."""
        covered, epoch = first - 1, 0
        restarts = ([r for r in keys.read_lost_ranges(self.metadata, topic) if r.broker_id == self.broker_id]
                    if history is not None else [])
        for d in list_descriptors(self.metadata, topic):
            if d.broker_id != self.broker_id:
                continue
            end = d.end_offset
            if history is not None and d.epoch > history:
                # A later epoch archived this WAL's own messages (a restart that recovered
                # it) only below where a takeover renumbered them since (a loss record of
                # this broker from ``history`` on, before that epoch).
                cut = min((r.start_offset for r in restarts if history <= r.epoch < d.epoch), default=None)
                if cut is not None:
                    end = min(end, cut - 1)
            epoch = max(epoch, d.epoch)
            if d.start_offset <= covered + 1 <= end:
                covered = end
        return covered + 1, epoch

    def cut_zone_end(self, topic: TopicName, start: int, tip: int, history: int | None = None) -> int | None:
        """Where a stale WAL's record ends when :meth:`first_unarchived_by_us` stopped below
        the archive start (retention removed the descriptors that would show whether this
        broker archived those offsets) and this broker's descriptors cover every offset
        from the archive start to the WAL's ``tip``: the last offset below the archive
        start. Those above it are archived by this broker and served, so a record over
        them would send their readers back for messages that never changed (atk51 F01).
        None otherwise: the record goes to the tip.

        ``history``: the epoch of the history the WAL is (its record's, or its marker's).
        A later epoch of this broker counts only below where a takeover renumbered that
        history (a loss record of this broker from that epoch on, before the later one):
        past it, the later epoch archived other messages under the same numbers, and
        counting them ended a record too early (atk54 F01). Before it, a later epoch that
        recovered the WAL on the same disk archived this WAL's own messages (atk55 F01)."""
        first_kept = archive_start(self.metadata, topic)
        if start >= first_kept or tip < first_kept:
            return None
        covered, _epoch = self.first_unarchived_by_us(topic, first_kept, history)
        return first_kept - 1 if covered > tip else None

    def write_lost(self, topic: TopicName, start: int, epoch: int, end: int | None, qpath: str | None,
                   wal_id: str | None = None, attributed: bool = True, ambiguous: bool = False) -> None:
        """Write this broker's exact LostRange: compare-and-swap against the current record
        (this broker does not own the topic, so ownership cannot fence this write).

        ``attributed``: the WAL is known to be that history's (its marker reads). A WAL
        whose marker does not read cannot make exact an "at least" record that knows no
        end: it may be an older copy, or another history's WAL (atk52 F02). (One that
        reaches the end the record knows, a published tip, is held to it like any WAL.)
        ``ambiguous``: the record was one of several this WAL could belong to: no "at
        least" record is made exact on its strength (atk54 F02)."""
        key = keys.lost_key(topic, start, epoch)
        kv = self.metadata.get(key)
        exact, unknown = True, False
        if kv is not None:
            earlier = keys.LostRange.from_json(kv.key, kv.value)
            if not earlier.exact and earlier.quarantine_path:
                # A WAL of this history was already given up: an operator discarded one that
                # did not open (range unknown), or an older copy went short of what the
                # takeover knew. This WAL is another copy of the same history (the first one,
                # or a backup of it), so it can neither confirm nor shorten that account: the
                # record stays "at least", grows to this WAL's tip at most, and keeps naming
                # the first WAL given up (this one is quarantined beside it).
                exact, qpath, wal_id = False, earlier.quarantine_path, earlier.wal_id or wal_id
                if earlier.end_offset is None:
                    end, unknown = None, True  # a discard's end is unknown: it covers all from start
                elif end is None or earlier.end_offset > end:
                    end = earlier.end_offset
            elif earlier.exact and earlier.quarantine_path:
                # A retry after a quarantine that moved part of the WAL (the same directory,
                # claimed by this WAL's identity): the exact record only grows, and keeps the
                # directory the first part went to. Another copy of the same history (its
                # own directory): the first one's account was exact only as far as that
                # copy knew, so the record stays the longer of the two, "at least".
                if qpath != earlier.quarantine_path:
                    exact = False
                if end is None or (earlier.end_offset is not None and earlier.end_offset > end):
                    end = earlier.end_offset
                qpath, wal_id = earlier.quarantine_path, earlier.wal_id or wal_id
            elif not earlier.exact and ambiguous:
                exact = False  # maybe another history's WAL: "at least", the longer end
                if earlier.end_offset is not None and (end is None or earlier.end_offset > end):
                    end = earlier.end_offset
            elif not attributed and not earlier.exact and earlier.end_offset is None:
                # The takeover knew no end (no tip of that history was published), and this
                # WAL is not known to be that history's (it may be an older copy): the
                # account stays "at least", to this WAL's tip.
                exact = False
            elif earlier.end_offset is not None and (end is None or earlier.end_offset > end):
                # The takeover knew of more than this WAL holds (an older copy of the data
                # dir came back): a record never shrinks; it stays "at least" that much.
                end, exact = earlier.end_offset, False
        published = None if unknown else self.published_past_archive(topic, epoch)
        if published is not None and published >= start and (end is None or published > end):
            # That epoch published a durable tip past this WAL's and past the archive: the
            # WAL lost synced data (an older copy), and what it acknowledged up to that tip
            # is lost too.
            end, exact = published, False
        record = keys.LostRange(start, end, self.broker_id, epoch, exact, qpath, self.broker_id, time.time(),
                                None if qpath is None else wal_id)
        compare = absent(key) if kv is None else value_is(key, kv.value)
        if not self.metadata.txn([compare], [Put(key, record.to_json())]).succeeded:
            raise StorageError(f"{key} changed while broker {self.broker_id} was recording its lost range; "
                               "the stale WAL is kept for a retry")

    def published_past_archive(self, topic: TopicName, epoch: int) -> int | None:
        """The durable tip this broker's ``epoch`` published, when it lies at or past where
        the archive continues (acknowledged offsets no object holds); None otherwise. A tip
        below that is archived: an older copy of the WAL lacking it lost nothing (the
        archive serves it, even once retention cut it)."""
        progress = read_progress(self.metadata, topic)
        if (progress is None or progress.broker_id != self.broker_id or progress.epoch != epoch
                or progress.durable_offset is None):
            return None
        if progress.durable_offset < DescriptorChain(self.metadata, topic).next_offset():
            return None
        return progress.durable_offset

    def record_discarded(self, topic: TopicName, start: int, end: int | None, epoch: int, qpath: str,
                         wal_id: str | None = None) -> str:
        """Record that an unreadable WAL of ``epoch`` is given up from ``start`` on (its
        range is unknown: ``exact: false``), before its files move to ``qpath``; returns
        the record's key. Compare-and-swap against the record read."""
        key = keys.lost_key(topic, start, epoch)
        kv = self.metadata.get(key)
        if kv is not None:
            # A record never shrinks: a takeover's or an earlier discard's account of the
            # same history that knew more stays (an unknown end covers everything), and
            # the first WAL given up stays the one it names.
            earlier = keys.LostRange.from_json(kv.key, kv.value)
            if earlier.end_offset is None and earlier.quarantine_path is not None and not earlier.exact:
                end = None
            elif earlier.end_offset is not None and (end is None or earlier.end_offset > end):
                end = earlier.end_offset
            if earlier.quarantine_path:
                qpath, wal_id = earlier.quarantine_path, earlier.wal_id or wal_id
        lost = keys.LostRange(start, end, self.broker_id, epoch, False, qpath, self.broker_id, time.time(), wal_id)
        compare = absent(key) if kv is None else value_is(key, kv.value)
        if not self.metadata.txn([compare], [Put(key, lost.to_json())]).succeeded:
            raise StorageError(f"{key} changed while recording a discarded WAL; kept for a retry")
        return key

    def takeover_records(self, token: OwnerToken, plan: RestorePlan, recovered: bool,
                         retired: RetiredWal | None,
                         missing: tuple[str, int] | None = None) -> tuple[list[Put], int]:
        """The LostRange writes of a load, for the fenced txn that marks the topic open,
        and how many offsets those records know were lost."""
        ops: list[Put] = []
        unarchived = 0
        recorded: set[tuple[str, int]] = set()
        histories = self.unrecorded_histories(token, plan, recovered, retired, recorded, missing)
        # The progress record counts for one history at most: the newest one it may
        # describe (see unarchived_by), never twice.
        counts = {pair: unarchived_by(plan.progress, *pair, plan.start_offset, recorded) for pair in histories}
        counted_for = max((pair for pair in histories if counts[pair] > 0), key=lambda pair: pair[1], default=None)
        for broker_id, epoch in histories:
            # The takeover's own account, in the same fenced txn as the open marker: where
            # numbering restarts and how much that owner is known to have lost (its last
            # published tip, also one an own reload of it left at an older epoch). Its WAL,
            # if it comes back, makes the record exact.
            start = plan.start_offset
            at_least = counts[(broker_id, epoch)] if (broker_id, epoch) == counted_for else 0
            unarchived += at_least
            record = keys.LostRange(start, start + at_least - 1 if at_least > 0 else None,
                                    broker_id, epoch, False, None, token.broker_id, time.time())
            ops.append(Put(keys.lost_key(token.topic, start, epoch), record.to_json()))
        return ops, unarchived

    def unrecorded_histories(self, token: OwnerToken, plan: RestorePlan, recovered: bool,
                              retired: RetiredWal | None,
                              recorded_out: set[tuple[str, int]] | None = None,
                              missing: tuple[str, int] | None = None) -> list[tuple[str, int]]:
        """The unsealed histories this load continues after without having their WAL,
        that no LostRange accounts for yet.

        * Every history the owner record says we inherited (taken from another holder by
          this acquire, or by an earlier attempt of ours that failed before recording it:
          :func:`tiered.lifecycle.ownership.inherited_histories`).
        * Our own previous epoch, when this load neither recovered its WAL nor retired it
          here as that epoch's history: it ran elsewhere (another data dir of this broker
          id) or left nothing on this disk. A stale WAL of ours retired here is an OLDER
          history, already recorded by whoever took it over.

        * ``missing``: an own earlier history the recovered WAL's marker says it does not
          hold (it was created empty after it, by a load that did not get to record it).

        ``recorded_out``: filled with the ``(broker_id, epoch)`` pairs LostRanges name."""
        previous = token.previous
        held = OwnerRecord.decode(token.key, token.held_bytes)
        wanted = list(held.inherits)
        if recovered and missing is not None:
            wanted.append(missing)
        if (not recovered and not plan.is_sealed and previous is not None
                and previous.holder == token.broker_id
                and not (retired is not None and (retired.current or retired.marker_epoch == previous.epoch))):
            wanted.append((previous.broker_id, previous.epoch))
        if not wanted:
            return []
        recorded = {(r.broker_id, r.epoch) for r in keys.read_lost_ranges(self.metadata, token.topic)}
        if retired is not None and retired.current and previous is not None:
            recorded.add((token.broker_id, previous.epoch))  # its retire wrote the exact record
        if recorded_out is not None:
            recorded_out.update(recorded)
        return [pair for pair in dict.fromkeys(wanted) if pair not in recorded]

