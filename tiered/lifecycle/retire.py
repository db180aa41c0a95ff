"""Stale local WALs: which WAL is this broker's current history, and letting go of the
others without ever losing silently.

A local WAL is stale when the topic's history moved on without it: the topic was taken
over from this broker (a failover), or numbering restarted past it. A stale WAL is

* **deleted** when every offset it holds is archived (nothing to keep, nothing lost);
* **quarantined** under ``<wal root>/.quarantine/<ns>/<topic>/<epoch>/`` otherwise (a
  directory of its own, claimed first: ``<epoch>.1``... when another copy of the same
  history is already there), the exact never-archived range recorded as a ``LostRange``
  FIRST (compare-and-swap), so a crash between the record and the move can never make
  the loss silent;
* **kept** when it does not open: its range is unknown, so nothing could record what
  it held (``LocalWalUnreadable``); only an operator's explicit discard quarantines it
  (:meth:`StaleWals.discard_unreadable`), recording "from here, end unknown" first.

Files move and are deleted in ``wal.fs.crash_safe_order`` (checkpoint first, segments
oldest first, ``.owner`` last): a crash part-way leaves a suffix that opens with the
same tip and is moved on by the retry, never a prefix that looks like a shorter history.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from tiered.archive import list_descriptors
from tiered.errors import StorageError
from tiered.metadata import keys
from tiered.metadata.base import MetadataStore
from tiered.archive.chain import DescriptorChain
from tiered.lifecycle.errors import LocalWalUnreadable, OwnHistoryElsewhere
from tiered.lifecycle.losses import LossRecords, RetiredWal
from tiered.lifecycle.metrics import LifecycleMetrics
from tiered.lifecycle.ownership import OwnerRecord, OwnerToken, read_owner
from tiered.lifecycle.restore import RestorePlan, read_progress, read_sealed_state
from tiered.lifecycle.wal_root import WalRoot, decode_marker, durable_tip
from tiered.metrics import topic_counter
from wal.fs import LOCK_NAME, crash_safe_order
from wal.topics import TopicName

log = logging.getLogger(__name__)

#: Directory under a WAL root where stale WALs holding unarchived offsets are moved.
QUARANTINE_DIR = ".quarantine"
#: Written into a quarantine directory before anything moves there: which WAL it takes
#: (``.walid`` and durable tip). A retry after a crash finds its own directory again by
#: it; another copy of the same history (an older backup of the data dir) gets a
#: directory of its own beside it, never files mixed into this one.
QUARANTINE_ID = ".quarantined"


def loss_accounted_for(metadata: MetadataStore, topic: TopicName, broker_id: str, epoch: int,
                       owner: OwnerRecord | None) -> bool:
    """Whether the loss of ``broker_id``'s history of ``epoch`` is already decided
    (:func:`loss_decided`, over the topic's stored records)."""
    inherits = owner.inherits if owner is not None else ()
    return loss_decided(keys.read_lost_ranges(metadata, topic), inherits, broker_id, epoch)


def loss_decided(lost: Iterable[keys.LostRange], inherits: Iterable[tuple[str, int]], broker_id: str,
                 epoch: int) -> bool:
    """Whether the loss of ``broker_id``'s history of ``epoch`` is already decided: a
    ``LostRange`` of that broker from that epoch on records it, or the owner record makes
    its holder account for it (``inherits``: an earlier attempt decided the takeover)."""
    if (broker_id, epoch) in set(inherits):
        return True
    return any(r.broker_id == broker_id and r.epoch >= epoch for r in lost)


def own_open_history_elsewhere(metadata: MetadataStore, root: WalRoot, topic: TopicName) -> OwnHistoryElsewhere | None:
    """Why a load here would take over this broker's own open history from another data
    dir (an :class:`OwnHistoryElsewhere` to raise), or None when it would not.

    The open history is the epoch that last marked the topic open (the sealed-state
    record with ``sealed: false``); it is this broker's when that record names this broker
    id and the owner record still holds the topic for it. Its WAL is here when this root
    holds the WAL that record names (``wal_id``: the WAL's ``.walid``); for a record from
    before ids were kept, a WAL whose ``.owner`` marker names that epoch or a later one (a
    later load of ours that failed before marking the topic open went on from it).
    Otherwise (no WAL, another WAL, an id or marker that does not read) the history is
    elsewhere and a load here would record it lost, so this refuses, unless nothing would
    be lost or the loss is already decided:

    * a ``LostRange`` of this broker from that epoch on already records it;
    * the owner record already makes its holder account for it (``inherits``: an earlier
      attempt decided the takeover);
    * the durable tip published by that very epoch lies below the archive's end.

    Fails closed: with no progress record of that epoch (never published, or its writes
    failed) it refuses, since the history may hold acknowledged messages nobody knows
    of. A progress record lags its WAL by up to ``broker.progress_interval_s``, so an
    epoch whose last publishes failed after earlier ones landed is judged by the last
    one that landed (docs/SAFETY.md)."""
    broker_id = root.broker_id
    owner, _kv = read_owner(metadata, topic)
    if owner is None or owner.released_at is not None or owner.broker_id != broker_id:
        return None
    state = read_sealed_state(metadata, topic)
    if state is None or state.sealed or state.broker_id != broker_id or state.epoch is None:
        return None
    epoch = state.epoch
    if root.exists(topic):
        local_id = root.read_wal_id(topic) if state.wal_id is not None else None
        if local_id is not None:
            # The open epoch named its WAL, and this one's id reads: it is here when this is
            # that WAL, as that epoch left it. Every load of ours writes its marker before it
            # marks the topic open, so a readable marker older than the epoch is an older
            # copy of the same WAL (a backup, a snapshot taken before a restart). A copy
            # newer than that is caught at recovery (``BrokerHost._published_past``).
            marker = root.read_owner_marker(topic)
            if local_id.hex() == state.wal_id and (marker is None or marker >= epoch):
                return None
            found = "another WAL" if local_id.hex() != state.wal_id else f"an older copy of it (epoch {marker})"
        else:
            # No id to compare (a state from before WAL ids were kept, or this WAL's id file
            # is missing or damaged): its ``.owner`` marker must name that epoch or a later
            # one. One that does not read proves nothing (a failed first load leaves such
            # an empty WAL): refused like no WAL; an override lets the load's rules judge it.
            marker = root.read_owner_marker(topic)
            if marker is not None and marker >= epoch:
                return None
            found = f"a WAL of epoch {marker}, older" if marker is not None else "a WAL whose owner marker does not read"
    else:
        found = "no WAL"
    if loss_accounted_for(metadata, topic, broker_id, epoch, owner):
        return None
    progress = read_progress(metadata, topic)
    if progress is not None and progress.broker_id == broker_id and progress.epoch == epoch:
        durable = -1 if progress.durable_offset is None else progress.durable_offset
        if durable < DescriptorChain(metadata, topic).next_offset():
            return None  # every message that epoch acknowledged is archived
    return OwnHistoryElsewhere(topic, broker_id, epoch, root.path(topic), found)


class StaleWals:
    """Decides whether this broker's local WAL of a topic is current, and retires the
    stale ones (delete or quarantine, loss recorded first)."""

    def __init__(self, root: WalRoot, metadata: MetadataStore, losses: LossRecords,
                 metrics: LifecycleMetrics) -> None:
        self.root = root
        self.metadata = metadata
        self.losses = losses
        self.metrics = metrics
        self.broker_id = root.broker_id
        self.wal_root = root.wal_root
        self.fs = root.fs
        #: Stale WALs retired (deleted or quarantined), oldest first.
        self.retired: list[RetiredWal] = []

    # The epoch that last opened a local WAL is kept beside it (``.owner``): the owner
    # record alone cannot tell, because a load that fails keeps ownership and bumps the
    # epoch without touching the WAL, and a takeover from us may have happened in between.

    def is_current(self, token: OwnerToken, start: int) -> tuple[bool, int]:
        """(is the local WAL this broker's current history, the epoch that wrote it);
        ``start``: where the topic continues past the archive (the restore plan's)."""
        previous = token.previous
        if previous is None or previous.holder != self.broker_id:
            marker = self.root.read_owner_marker(token.topic)
            return False, marker if marker is not None else -1
        marker = self.root.read_owner_marker(token.topic)
        if self._given_up(token.topic) is not None:
            # A part of this very WAL already went to quarantine under a loss record (a
            # discard or a retire that failed mid-move): its history was given up, and what
            # is left here is the rest of it, to be moved after it, never recovered.
            return False, marker if marker is not None else previous.epoch
        if marker == previous.epoch:
            return True, previous.epoch
        state = read_sealed_state(self.metadata, token.topic)
        ours_wrote_state = (state is not None and state.broker_id == self.broker_id and state.epoch is not None)
        if marker is None and ours_wrote_state and state is not None and not state.sealed and state.wal_id is not None:
            # The open epoch named its WAL: one whose id reads is its history exactly when it
            # is that WAL (a damaged marker cannot make another WAL of ours pass for it).
            # Without a readable id either, the rules below judge it as before ids were kept.
            local_id = self.root.read_wal_id(token.topic)
            if local_id is not None:
                return local_id.hex() == state.wal_id, previous.epoch
        if marker is None:
            # No marker although every load of ours writes it before marking the topic open:
            # while the state names an epoch of ours, a WAL that holds nothing past the
            # archive is a load's that failed or died before its marker, no history (a newer
            # load of ours may have continued from another WAL); recovering it would take the
            # archive's end for the topic's end. One that holds more is left to the rules as
            # before markers: it may be a current WAL whose marker was damaged.
            return not (ours_wrote_state and self._holds_nothing_past(token.topic, start)), previous.epoch
        if ours_wrote_state and state is not None and state.epoch is not None and state.epoch > marker:
            # A newer epoch of ours marked the topic open: that load continued from another
            # WAL (this one's marker would name it otherwise), e.g. on another data dir.
            return False, marker
        taken = [r for r in keys.read_lost_ranges(self.metadata, token.topic)
                 if r.broker_id == self.broker_id and r.epoch >= marker]
        # Epochs moved on since the WAL was opened: by our own failed loads only (still
        # current), or by a takeover from us and back (stale: its loss is recorded).
        return (not taken), marker

    def _sealed_by_its_epoch(self, topic: TopicName, tip: int | None) -> keys.SealedState | None:
        """The sealed state, when the epoch that wrote this WAL (its ``.owner`` marker) sealed
        the topic at or past the WAL's tip; None otherwise."""
        marker = self.root.read_owner_marker(topic)
        if marker is None:
            return None
        state = read_sealed_state(self.metadata, topic)
        if (state is None or not state.sealed or state.broker_id != self.broker_id or state.epoch != marker):
            return None
        if tip is not None and (state.last_committed_offset is None or state.last_committed_offset < tip):
            return None
        return state

    def _ended_by_a_seal(self, topic: TopicName, marker: int) -> bool:
        """Whether this broker's history of epoch ``marker`` provably ended with a seal: the
        sealed state is that epoch's own, and no loss record names it. A later epoch having
        opened the topic proves nothing: a later load of this broker that recovered another
        WAL writes no record for the epoch before it (atk48 F01)."""
        return (self.losses.own_lost_record(topic, marker) is None
                and self._sealed_by_its_epoch(topic, None) is not None)

    def _archived_by_epoch(self, topic: TopicName, epoch: int) -> int | None:
        """The last offset this broker archived at ``epoch`` (None: nothing)."""
        ends = [d.end_offset for d in list_descriptors(self.metadata, topic)
                if d.broker_id == self.broker_id and d.epoch == epoch]
        return max(ends, default=None)

    def _wal_id_hex(self, topic: TopicName) -> str | None:
        local_id = self.root.read_wal_id(topic)
        return None if local_id is None else local_id.hex()

    def _given_up(self, topic: TopicName) -> keys.LostRange | None:
        """This broker's loss record whose quarantine directory was claimed for this very
        WAL (its ``.quarantined`` names the local WAL's id), or None."""
        local_id = self.root.read_wal_id(topic)
        if local_id is None:
            return None
        for record in keys.read_lost_ranges(self.metadata, topic):
            if record.broker_id != self.broker_id or not record.quarantine_path:
                continue
            if record.wal_id is not None:
                # Named in the record itself: no file on this disk can hide it.
                if record.wal_id == local_id.hex():
                    return record
                continue
            claimed = self._quarantined(record.quarantine_path)  # a record from before ids were kept
            if claimed is not None and claimed.get("wal_id") == local_id.hex():
                return record
        return None

    def _holds_nothing_past(self, topic: TopicName, start: int) -> bool:
        """Whether the local WAL of ``topic`` opens and ends at or below ``start``."""
        try:
            probe = self.root.open_local(topic)
        except LocalWalUnreadable:
            return False  # not empty as far as anyone can tell: the usual rules decide
        try:
            return probe.next_offset <= start
        finally:
            probe.close()

    def retire(self, topic: TopicName, start: int | None = None, epoch: int | None = None) -> RetiredWal:
        """Delete or quarantine this broker's stale WAL of ``topic``; never lose silently.

        ``start``/``epoch``: where the topic's numbering restarted after this broker's
        epoch ``epoch``. When a broker comes back they are unknown (None): the LostRange
        the taker-over wrote naming this broker says them; without one (a stale WAL left
        by a crash between seal and delete), the first offset of this WAL that no
        descriptor of this broker archived.
        """
        path = self.root.path(topic)
        # A WAL that does not open is never moved or deleted here: its range is unknown,
        # so nothing could record what it held (LocalWalUnreadable; the operator decides).
        wal = self.root.open_local(topic)
        try:
            first, tip = wal.first_offset, durable_tip(wal)
        finally:
            wal.close()
        deleted = self._of_deleted_incarnation(topic)
        if deleted is not None:
            self.delete(topic)
            log.warning("topic %s: deleted stale local WAL %d..%s of epoch %d: the topic was deleted at epoch %d "
                        "(tombstone %s), so its offsets went with it", topic, first, tip, deleted[0], deleted[1],
                        keys.tombstone_key(topic))
            retired = RetiredWal(topic, first, tip, None, None, deleted[0], None)
            self.retired.append(retired)
            return retired
        unattributed = self._unattributed_after_delete(topic, first)
        if unattributed is not None:
            leaf = f"deleted-incarnation-{unattributed.epoch:0{keys.OFFSET_DIGITS}d}"
            qpath = self.quarantine(topic, path, self.claim_quarantine(topic, leaf, tip))
            log.error("topic %s: quarantined local WAL %d..%s at %s: its .owner marker is unreadable and it "
                      "is not known to hold anything of the topic's current incarnation (created again after "
                      "the delete at epoch %d, tombstone %s), so it is taken for the deleted incarnation's: "
                      "kept for an operator, no loss recorded against the new incarnation", topic, first, tip,
                      qpath, unattributed.epoch, keys.tombstone_key(topic))
            retired = RetiredWal(topic, first, tip, None, None, unattributed.epoch, qpath)
            self.retired.append(retired)
            return retired
        record = None
        wal_epoch: int | None = None
        lost_end: int | None = None  # where the record ends when not at the tip (cut_zone_end)
        ambiguous = False  # an unmarked WAL that more than one own record could be the account of
        given_up = self._given_up(topic)
        sealed = self._sealed_by_its_epoch(topic, tip) if given_up is None else None
        if sealed is not None:
            # Its own epoch sealed the topic past its tip: the seal is written only after
            # that epoch's uploader archived everything (a crash or an I/O error came
            # between the seal and this delete). Nothing of it is lost, even where a
            # retention cut has since removed the descriptors that showed it.
            self.delete(topic)
            log.info("topic %s: deleted stale local WAL %d..%s: its epoch %d sealed the topic at %s, so every "
                     "offset it held is archived", topic, first, tip, sealed.epoch, sealed.last_committed_offset)
            retired = RetiredWal(topic, first, tip, None, None, sealed.epoch or 0, None,
                                 marker_epoch=sealed.epoch)
            self.retired.append(retired)
            return retired
        if given_up is not None:
            # Part of this very WAL already went to quarantine under this record (a move
            # interrupted): the rest belongs to the same account and the same directory,
            # whatever newer record names this broker since.
            wal_epoch = self.root.read_owner_marker(topic)
            record, start, epoch = given_up, given_up.start_offset, given_up.epoch
            if tip is not None:
                # Ended where the first part's account ended (write_lost never shortens it).
                lost_end = self.losses.cut_zone_end(topic, start, tip, history=epoch)
        elif start is None or epoch is None:
            wal_epoch = self.root.read_owner_marker(topic)
            if wal_epoch is None and tip is not None:
                record, ambiguous = self.losses.own_record_within(topic, first, tip)
            else:
                record = self.losses.own_lost_record(topic, wal_epoch)
            if record is not None and wal_epoch is not None and record.epoch != wal_epoch:
                # A LATER epoch's record (failed loads of ours in between, or a history of
                # this broker id on another data dir): it says where numbering restarted,
                # but this WAL can neither confirm nor complete another epoch's account (it
                # would erase a real loss); this WAL's own account gets its own record.
                start, epoch, record = record.start_offset, wal_epoch, None
            elif record is not None:
                start, epoch = record.start_offset, record.epoch
                if record.quarantine_path and tip is not None:
                    # An earlier retire's account of a copy of this history: the same end.
                    lost_end = self.losses.cut_zone_end(topic, start, tip, history=epoch)
            else:
                start, archived_epoch = self.losses.first_unarchived_by_us(topic, first)
                # The history this WAL is: the epoch that opened it when its marker says so
                # (the newest epoch that archived anything may be a later history of this
                # broker on another disk, whose own loss must stay its own: fuzz seed 4034).
                epoch = wal_epoch if wal_epoch is not None else archived_epoch
                if tip is not None:
                    lost_end = self.losses.cut_zone_end(topic, start, tip, history=wal_epoch)
        lost_start = max(start, first)
        walked = (self.losses.first_unarchived_by_us(topic, first)
                  if tip is not None and tip < lost_start and record is not None and wal_epoch is None
                  and given_up is None else None)
        if walked is not None and tip is not None and walked[0] <= tip:
            # A record without a marker to tie it to this WAL is no proof that what the WAL
            # holds is archived: it is deleted only when this broker's own descriptors cover
            # all of it. Otherwise it is accounted for by them, and kept.
            record = None
            start, epoch = walked
            lost_start = max(start, first)
            lost_end = self.losses.cut_zone_end(topic, start, tip)
        if given_up is not None and not given_up.exact and tip is not None and tip < lost_start:
            # A record that gave up a WAL whose range was unknown (an operator's discard):
            # its start is no property of what the WAL held, so it proves nothing archived
            # below it. This copy (a backup of that WAL, say) is kept beside the first one,
            # under the same record, never deleted (atk53 F03).
            qpath = self.quarantine(topic, path, self.claim_quarantine(topic, f"{epoch:0{keys.OFFSET_DIGITS}d}", tip,
                                                                       resume=given_up))
            log.error("topic %s: quarantined stale local WAL %d..%d at %s: an earlier copy of it was discarded as "
                      "unreadable (recorded at %s), which says nothing of what this copy holds; kept for an "
                      "operator", topic, first, tip, qpath, keys.lost_key(topic, given_up.start_offset, given_up.epoch))
            retired = RetiredWal(topic, first, tip, None, None, epoch, qpath, marker_epoch=wal_epoch)
            self.retired.append(retired)
            return retired
        if tip is None or tip < lost_start:
            # Everything this WAL held is archived: nothing to keep, nothing lost.
            if record is not None and self._confirms(topic, record, wal_epoch):
                self.losses.write_lost(topic, start, epoch, None, None)  # confirm: nothing was lost
            elif record is None and self._published_from(topic, epoch, lost_start):
                # Its epoch published a durable tip past what is archived, which this WAL
                # does not hold (an older copy): those acknowledged offsets are lost, and
                # nothing else records them. ``write_lost`` takes the end from that tip.
                self.losses.write_lost(topic, start, epoch, None, None)
            self.delete(topic)
            log.info("topic %s: deleted stale local WAL %d..%s: every offset it held is archived",
                     topic, first, tip)
            retired = RetiredWal(topic, first, tip, None, None, epoch, None, marker_epoch=wal_epoch)
        else:
            qpath = self.claim_quarantine(topic, f"{epoch:0{keys.OFFSET_DIGITS}d}", tip, resume=given_up or record)
            # Record first: if the move then fails, a retry finds the same range and path;
            # a move without a record would be a silent loss if this broker died next.
            end = tip if lost_end is None else lost_end
            self.losses.write_lost(topic, start, epoch, end, qpath, self._wal_id_hex(topic),
                                   attributed=wal_epoch is not None or given_up is not None,
                                   ambiguous=ambiguous and record is not None)
            self.quarantine(topic, path, qpath)
            topic_counter(self.metrics.registry, self.metrics.quarantined_offsets, topic).inc(end - lost_start + 1)
            log.warning("topic %s: quarantined stale local WAL of epoch %d at %s: offsets %d-%d were durable "
                        "here but never archived, and the topic's numbering restarted at %d, so they are lost "
                        "(recorded at %s)", topic, epoch, qpath, lost_start, end, start,
                        keys.lost_key(topic, start, epoch))
            retired = RetiredWal(topic, first, tip, lost_start, end, epoch, qpath, marker_epoch=wal_epoch)
        self.retired.append(retired)
        return retired

    def _confirms(self, topic: TopicName, record: keys.LostRange, wal_epoch: int | None) -> bool:
        """Whether this WAL, holding nothing past the record's start, proves the record's
        history lost nothing, so the record may become ``exact`` with no end. Only when the
        record is this very WAL's account:

        - its ``.owner`` marker is readable and names the record's epoch (a marker-less WAL
          is also what a load leaves that failed or died before writing the marker: it is
          evidence about no history, and the newest record may be another disk's);
        - the marker names no ``missing`` history (the WAL was created empty after an own
          epoch it never held: a takeover may have counted that epoch's published tip
          under this WAL's epoch);
        - the record names no end: an end is a tip published as durable, which an empty
          WAL of that history would have held, so it was counted from another one;
        - the record names no quarantine path: a WAL of that history was already given up
          (an operator's discard of one that did not open, whose range is unknown), so
          this one is at best an older copy of it, and proves nothing about what it held.

        Precondition of the rewrite this allows (a loss record erased): all four hold.
        Otherwise the record stays as the taker-over wrote it (conservative: "at least")."""
        if record.exact or record.end_offset is not None or record.quarantine_path is not None:
            return False
        if wal_epoch is None or record.epoch != wal_epoch:
            return False
        return self.root.read_owner_marker_missing(topic) is None

    def _known_end(self, topic: TopicName, epoch: int, start: int) -> int | None:
        """The last offset from ``start`` on known to be held by this broker's history of
        ``epoch``, whose WAL is being discarded: the WAL's own tip when it opens after all
        (a readable copy refused for ending below its published tip), or the durable tip
        that epoch published, whichever is further; None: nothing known (the record says
        "end unknown")."""
        known: list[int] = []
        try:
            wal = self.root.open_local(topic)
        except LocalWalUnreadable:
            pass
        else:
            try:
                tip = durable_tip(wal)
            finally:
                wal.close()
            if tip is not None:
                known.append(tip)
        progress = read_progress(self.metadata, topic)
        if (progress is not None and progress.broker_id == self.broker_id and progress.epoch == epoch
                and progress.durable_offset is not None):
            known.append(progress.durable_offset)
        end = max(known, default=-1)
        return end if end >= start else None

    def _published_from(self, topic: TopicName, epoch: int, start: int) -> bool:
        """Whether this broker's ``epoch`` published a durable tip at or past ``start`` and
        past the archive, and no record accounts for that history yet."""
        published = self.losses.published_past_archive(topic, epoch)
        if published is None or published < start:
            return False
        owner, _kv = read_owner(self.metadata, topic)
        return not loss_accounted_for(self.metadata, topic, self.broker_id, epoch, owner)

    def _of_deleted_incarnation(self, topic: TopicName) -> tuple[int, int] | None:
        """(the WAL's epoch, the tombstone's epoch) when the local WAL was written by an
        incarnation of the topic that was deleted: its ``.owner`` epoch is at or below the
        tombstone's last epoch (epochs keep growing across a re-creation, so a WAL of the
        new incarnation is always above it). Such a WAL is deleted, never resumed and never
        recorded as a loss of the new incarnation. None: not known to be one (no
        tombstone, or no readable ``.owner``): the usual rules below apply."""
        tomb, _raw = keys.read_tombstone(self.metadata, topic)
        if tomb is None:
            return None
        marker = self.root.read_owner_marker(topic)
        if marker is None or marker > tomb.epoch:
            return None
        return marker, tomb.epoch

    def _unattributed_after_delete(self, topic: TopicName, first: int) -> keys.TopicTombstone | None:
        """The tombstone, when the topic was deleted, this WAL's ``.owner`` marker is
        unreadable (damaged or missing), and nothing says the WAL belongs to the current
        incarnation: it starts below the tombstone's ``next_offset`` (every WAL of the
        new incarnation starts at or past it), or this broker has no history in the new
        incarnation (no descriptor of it, and no LostRange naming it, above the
        tombstone's epoch). Such a WAL is quarantined without a loss record: the usual
        rules would count the deleted incarnation's offsets as losses of the new one
        (offsets it never had, or ones it acknowledged itself). None: the usual rules."""
        tomb, _raw = keys.read_tombstone(self.metadata, topic)
        if tomb is None or self.root.read_owner_marker(topic) is not None:
            return None
        if first < tomb.next_offset:
            return tomb
        newer = any(d.broker_id == self.broker_id and d.epoch > tomb.epoch
                    for d in list_descriptors(self.metadata, topic))
        newer = newer or any(r.broker_id == self.broker_id and r.epoch > tomb.epoch
                             for r in keys.read_lost_ranges(self.metadata, topic))
        return None if newer else tomb

    def discard_unreadable(self, topic: TopicName, plan: RestorePlan, epoch: int | None) -> RetiredWal:
        """The operator chose to give up a WAL that does not open: record, then quarantine.

        The range it held is unknown; what is known is where numbering restarts
        (``plan.start_offset``), so the record says "from there, end unknown" (``exact:
        false``), written before the files move so a crash in between cannot make the
        loss silent."""
        start, end, record = plan.start_offset, None, self._given_up(topic)
        if record is not None:
            # The rest of a WAL whose move under this record was interrupted.
            start, end, epoch = record.start_offset, record.end_offset, record.epoch
        elif epoch is not None:
            end = self._known_end(topic, epoch, start)
        if epoch is None:
            # A stale WAL of an earlier epoch: its loss began where the topic's numbering
            # restarted after it (the taker-over's record), not where it continues now.
            marker = self.root.read_owner_marker(topic)
            kept_whole = self._unreadable_without_loss(topic, marker)
            if kept_whole is not None:
                return kept_whole
            record = self.losses.own_lost_record(topic, marker)
            if record is not None:
                start, end, epoch = record.start_offset, record.end_offset, record.epoch
            else:
                start, archived_epoch = self.losses.first_unarchived_by_us(topic, 0)
                epoch = marker if marker is not None else archived_epoch
                archived_to = None if marker is None else self._archived_by_epoch(topic, marker)
                if archived_to is not None:
                    # That epoch's own archive ends there: what it may have lost comes after
                    # (the start of its WAL is unknown; other brokers' offsets are not its).
                    start = max(start, archived_to + 1)
        qpath = self.claim_quarantine(topic, f"unreadable-{epoch:0{keys.OFFSET_DIGITS}d}", None, resume=record)
        key = self.losses.record_discarded(topic, start, end, epoch, qpath, self._wal_id_hex(topic))
        self.quarantine(topic, self.root.path(topic), qpath)
        log.error("topic %s: discarded the unreadable local WAL on the operator's request: quarantined at %s, "
                  "offsets from %d on that it held are lost (range unknown, recorded at %s)",
                  topic, qpath, start, key)
        retired = RetiredWal(topic, -1, None, start, end, epoch, qpath)
        self.retired.append(retired)
        return retired

    def _unreadable_without_loss(self, topic: TopicName, marker: int | None) -> RetiredWal | None:
        """Quarantine, with no loss record, an unreadable stale WAL whose history lost
        nothing: a deleted incarnation's (its marker at or below the tombstone's epoch:
        its offsets went with the delete), or one whose epoch ended with a seal (every
        offset it acknowledged archived). None: neither is known, a record is needed."""
        deleted = self._of_deleted_incarnation(topic)
        if deleted is not None:
            leaf, why = (f"deleted-incarnation-{deleted[1]:0{keys.OFFSET_DIGITS}d}",
                         f"its epoch {deleted[0]} belongs to the incarnation deleted at epoch {deleted[1]}")
        elif marker is not None and self._ended_by_a_seal(topic, marker):
            leaf, why = f"unreadable-{marker:0{keys.OFFSET_DIGITS}d}", f"its epoch {marker} ended with a seal"
        else:
            return None
        qpath = self.quarantine(topic, self.root.path(topic), self.claim_quarantine(topic, leaf, None))
        log.error("topic %s: discarded the unreadable local WAL on the operator's request: quarantined at %s; "
                  "%s, so nothing it held is lost and no loss is recorded", topic, qpath, why)
        retired = RetiredWal(topic, -1, None, None, None, deleted[0] if deleted else (marker or 0), qpath,
                             marker_epoch=marker)
        self.retired.append(retired)
        return retired

    def claim_quarantine(self, topic: TopicName, leaf: str, tip: int | None,
                         resume: keys.LostRange | None = None) -> str:
        """The directory the local WAL of ``topic`` (durable tip ``tip``) is quarantined in:
        ``<root>/.quarantine/<ns>/<topic>/<leaf>``, or ``<leaf>.1``, ``.2``... when that
        one holds another WAL. Created durably with the WAL's identity (:data:`QUARANTINE_ID`)
        BEFORE the loss record names it, so a retry after a crash finds the same directory
        and the record never names one holding another WAL (two copies of one history, e.g.
        the WAL and an older backup of it, share ``.walid`` and epoch but not the tip)."""
        wal_id = self.root.read_wal_id(topic)
        identity = {"wal_id": None if wal_id is None else wal_id.hex(), "tip": tip}
        # A retry after a partial move finds there only what already moved: none of the
        # files still here (the checkpoint aside: the retry's open rewrote it). A second
        # full copy of the same WAL (a snapshot taken after the crash) has the same
        # identity but clashes with every file: it gets a directory of its own.
        here = [n for n in self.fs.listdir(self.root.path(topic)) if n not in ("wal.ckpt", LOCK_NAME)]
        path = None if resume is None else resume.quarantine_path
        if path and self.fs.exists(path):
            # The directory the loss record names, when it took a first part of this very WAL
            # (its id, named by the record or the directory; none of the files still here):
            # a move interrupted under another leaf (a discard of the WAL's unreadable head,
            # then a retire of the readable rest) goes on there, so the record names the
            # whole WAL.
            claimed = self._quarantined(path)
            claimed_id = resume.wal_id if resume is not None and resume.wal_id is not None else \
                (claimed.get("wal_id") if claimed is not None else None)
            if identity["wal_id"] is not None and claimed_id == identity["wal_id"] and self._holds_none(path, here):
                return path
        base = os.path.join(self.wal_root, QUARANTINE_DIR, topic.namespace, topic.name)
        n = 0
        while True:
            qpath = os.path.join(base, leaf if n == 0 else f"{leaf}.{n}")
            if not self.fs.exists(qpath):
                break
            if self._quarantined(qpath) == identity and self._holds_none(qpath, here):
                return qpath  # claimed by this WAL before a crash: the retry goes on there
            n += 1
        self.fs.makedirs(qpath)
        qroot = os.path.join(self.wal_root, QUARANTINE_DIR)
        for directory in (self.wal_root, qroot, os.path.dirname(base), base):
            self.fs.fsync_dir(directory)
        self.root.write_marker(os.path.join(qpath, QUARANTINE_ID), identity)
        return qpath

    def _holds_none(self, qpath: str, names: list[str]) -> bool:
        return not any(self.fs.exists(os.path.join(qpath, name)) for name in names)

    def _quarantined(self, qpath: str) -> dict[str, object] | None:
        try:
            return decode_marker(self.fs.read_all(os.path.join(qpath, QUARANTINE_ID)))
        except OSError:
            return None

    def quarantine(self, topic: TopicName, path: str, qpath: str) -> str:
        """Move the WAL's files to ``qpath`` (from :meth:`claim_quarantine`) through the
        WAL's file layer, durably: both ends are fsynced. Counted once moved."""
        fs = self.fs
        # A crash in between leaves here a suffix of the WAL without a checkpoint, which
        # opens with the same tip and is moved on by the retry; never a prefix that would
        # look like a shorter history (wal.fs.crash_safe_order).
        names = crash_safe_order(fs.listdir(path))
        # A quarantined WAL may be the only copy of lost messages: never overwrite one. (A
        # retry after a partial move finds only the files not moved yet still here.)
        clashes = [n for n in names if n != "wal.ckpt" and fs.exists(os.path.join(qpath, n))]
        if clashes:
            raise StorageError(f"quarantine {qpath} already holds {', '.join(sorted(clashes))} from another "
                               f"WAL; {path} is kept in place")
        if "wal.ckpt" in names and fs.exists(os.path.join(qpath, "wal.ckpt")):
            # A retry (the directory was claimed with this WAL's identity): the checkpoint
            # moved first describes the whole WAL; the one here was rewritten when the retry
            # opened the rest (derived data, dropped).
            names.remove("wal.ckpt")
            fs.remove(os.path.join(path, "wal.ckpt"))
        for name in names:
            fs.rename(os.path.join(path, name), os.path.join(qpath, name))
        if fs.exists(os.path.join(path, LOCK_NAME)):
            fs.remove(os.path.join(path, LOCK_NAME))
        fs.fsync_dir(qpath)
        fs.fsync_dir(path)
        fs.rmdir(path)
        fs.fsync_dir(os.path.dirname(path))
        topic_counter(self.metrics.registry, self.metrics.quarantines, topic).inc()
        return qpath

    def delete(self, topic: TopicName) -> None:
        """Remove a closed stale WAL whose every offset is archived (durably: dir fsynced)."""
        path = self.root.path(topic)
        # The .owner marker goes last: a crash part-way leaves a WAL that opens and still
        # says which epoch wrote it, so the retry decides the same way (wal.fs.crash_safe_order).
        for name in [*crash_safe_order(self.fs.listdir(path)), LOCK_NAME]:
            if name == LOCK_NAME and not self.fs.exists(os.path.join(path, name)):
                continue
            self.fs.remove(os.path.join(path, name))
        self.fs.rmdir(path)
        self.fs.fsync_dir(os.path.dirname(path))

