"""TieredReader: one contiguous stream of a topic, from the archive, then the WAL, then live.

``create_reader(topic, wal, metadata, objects, start)`` picks the tiers:

* ``start >= wal.first_offset``: the local WAL only (replay, then live).
* ``start < wal.first_offset``: a :class:`~tiered.read.cloud.CloudReader` for
  ``[start, wal.first_offset - 1]``, chained to the WAL at ``wal.first_offset``, then live.
* ``wal is None`` (the topic is not hosted here): the archive only, up to the last
  committed descriptor at creation time; the reader then ends.

``start`` may be an offset, ``"earliest"`` (the first retained archived offset, else the
WAL's first offset) or ``"latest"`` (the topic's next offset: only new messages). An
offset below the archive start (archive retention removed it, :mod:`tiered.archive.start`)
is :class:`~tiered.archive.start.OffsetBelowArchiveStart` (an ``OffsetBelowRetention``)
naming the first retained offset, whichever tier still holds it; so is a read that
retention overtakes while it runs (the cloud reader re-reads the start before calling a
missing object or descriptor a ``DataGap``).

Every message is checked at every handoff (object to object, cloud to WAL, replay to
live): its offset must be exactly the previous one + 1. A forward jump raises
:class:`DataGap` naming the missing range; a repeated or backward offset raises
:class:`OffsetOutOfOrder`. Nothing is skipped or served twice, ever: an error ends the
stream, and a consumer recovers by creating a new reader at ``position``.

If WAL retention moved past the handoff point while the archive was being read (the
WAL's first offset advanced), the reader reads the newly archived part from the cloud
too, a bounded number of times.

Each message carries its ``tier``: ``"cloud"``, ``"wal"`` (already durable when the
reader reached the WAL) or ``"live"`` (appended after the reader caught up).

``for`` and ``async for`` both work (one style per reader). ``async for`` never blocks
the event loop: archive reads run in a worker thread, a batch at a time, and the WAL
is read through its own async iterator.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Literal

from native.format import Record

from tiered.read.cloud import MEMORY_BYTES_MAX_DEFAULT, CloudReader
from tiered.metrics import topic_gauge
from tiered.read.messages import TIER_CLOUD, TIER_LIVE, TIER_WAL, Message
from tiered.read.metrics import ReadMetrics
from tiered.archive.chain import DescriptorChain
from tiered.archive.start import archive_start, check_retained
from tiered.errors import TopicDeleted
from tiered.metadata import keys
from tiered.metadata.base import MetadataStore
from tiered.objects.base import ObjectStore
from tiered.read.errors import DataGap, HistoryDiverged, OffsetOutOfOrder, ReaderClosed, TopicMoved, UnknownOffset
from wal.api import WalOffsets, WalTailReader, WalTailSource
from wal.errors import OffsetBelowRetention
from wal.topics import TopicName

log = logging.getLogger(__name__)


Start = int | Literal["earliest", "latest"]

#: How often (in messages) the lag gauge is sampled: reading the WAL's next offset
#: on every message would cost more than serving it.
LAG_SAMPLE_MESSAGES = 256
#: Messages fetched from the archive per worker-thread hop in ``async for``.
ASYNC_BATCH_MESSAGES = 512
#: Messages taken from the archive per refill in ``for`` (amortises the generator hops).
SYNC_BATCH_MESSAGES = 64

_PHASE_CLOUD, _PHASE_WAL, _PHASE_DONE = "cloud", "wal", "done"


def create_reader(topic: TopicName | str, wal: WalTailSource | None, metadata: MetadataStore, objects: ObjectStore,
                  start: Start, *, live: bool = True, prefetch_objects: int = 1,
                  memory_bytes_max: int = MEMORY_BYTES_MAX_DEFAULT,
                  metrics: ReadMetrics | None = None,
                  on_served: Callable[[int], None] | None = None) -> "TieredReader":
    """A reader of ``topic`` from ``start``; see the module docstring for the tier choice."""
    topic = TopicName.parse(topic)
    tomb, _raw = keys.read_tombstone(metadata, topic)
    if tomb is not None and tomb.blocks:
        # Deleted, or its delete has begun: never serve what is left of it. A reader made
        # before the tombstone has a fixed archive end and meets a DataGap or a missing
        # object (typed errors) where the delete removed descriptors or objects.
        raise TopicDeleted(topic, tomb.phase, tomb.next_offset)
    offset = resolve_start(topic, wal, metadata, start)
    return TieredReader(topic, wal, metadata, objects, offset, live=live,
                        prefetch_objects=prefetch_objects, memory_bytes_max=memory_bytes_max, metrics=metrics,
                        on_served=on_served)


def resolve_start(topic: TopicName, wal: WalOffsets | None, metadata: MetadataStore, start: Start) -> int:
    """``start`` as an offset; an offset beyond the topic's next offset is UnknownOffset,
    one below the archive start OffsetBelowArchiveStart."""
    if start == "latest":
        return topic_next_offset(topic, wal, metadata)
    if start == "earliest":
        return earliest_offset(topic, wal, metadata)
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise ValueError(f"start must be an offset >= 0, 'earliest' or 'latest', got {start!r}")
    next_offset = topic_next_offset(topic, wal, metadata)
    if start > next_offset:
        raise UnknownOffset(start, next_offset, what="start offset")
    check_retained(metadata, topic, start)
    return start


def earliest_offset(topic: TopicName, wal: WalOffsets | None, metadata: MetadataStore) -> int:
    """The first offset the topic still holds: the archive's first retained offset (its
    descriptors below the archive start are a cut's leftovers, never served), else the
    WAL's first offset, else 0."""
    # The WAL's first offset is read BEFORE the archive: WAL retention removes only what
    # was archived, so if the archive is still empty after this read, nothing below this
    # first offset was archived or removed. (Read after, an upload and a retention landing
    # in between would start past the newly archived prefix.)
    wal_first = 0 if wal is None else int(wal.first_offset)
    start = archive_start(metadata, topic)
    first = DescriptorChain(metadata, topic).first()
    if first is not None:
        return max(first.start_offset, start)
    return max(start, wal_first)


def topic_next_offset(topic: TopicName, wal: WalOffsets | None, metadata: MetadataStore) -> int:
    """The WAL's next offset; without a WAL, one past the last committed descriptor."""
    if wal is not None:
        return int(wal.next_offset)
    # A re-created topic that archived nothing yet starts at its incarnation's first offset.
    return max(DescriptorChain(metadata, topic).next_offset(), archive_start(metadata, topic))


class TieredReader:
    """A contiguous stream of :class:`Message` from ``start_offset``. See the module docstring."""

    def __init__(self, topic: TopicName | str, wal: WalTailSource | None, metadata: MetadataStore, objects: ObjectStore,
                 start_offset: int, *, live: bool = True, prefetch_objects: int = 1,
                 memory_bytes_max: int = MEMORY_BYTES_MAX_DEFAULT, metrics: ReadMetrics | None = None,
                 on_served: Callable[[int], None] | None = None) -> None:
        self.topic = TopicName.parse(topic)
        #: Called with the size (payload + key) of every message handed out (load reports).
        self._on_served = on_served
        self.metrics = metrics if metrics is not None else ReadMetrics.create()
        self._reads = {tier: self.metrics.reads.labels(tier) for tier in (TIER_CLOUD, TIER_WAL, TIER_LIVE)}
        self.wal = wal
        self.metadata = metadata
        self.objects = objects
        self.live = live
        self.prefetch_objects = prefetch_objects
        self.memory_bytes_max = memory_bytes_max
        self.start_offset = start_offset
        self._position = start_offset
        self._cloud: CloudReader | None = None
        self._cloud_readers: list[CloudReader] = []  # kept for counters after they finish
        self._pending: collections.deque[Message] = collections.deque()
        self._wal_reader: WalTailReader | None = None
        # The WAL reader as iterated by next() and by anext() (the same object, one state).
        self._wal_iter: Iterator[Record] | None = None
        self._wal_aiter: AsyncIterator[Record] | None = None
        self._live_from: int | None = None
        self._retention_retries = 0  # times WAL retention sent this reader back to the archive
        self._served = 0
        self._mode: str | None = None
        self._io_lock = threading.Lock()  # one archive batch or WAL open at a time
        self._cloud_hop: asyncio.Future[None] | None = None  # async: the archive batch in flight
        self._closed = False
        self._moved = False
        # Set when the topic moved because a failover replaced this owner's history from
        # this offset on (a fenced owner): see move_away.
        self._diverged_from: int | None = None
        self._phase = self._initial_phase()

    # -- public ------------------------------------------------------------------
    @property
    def position(self) -> int:
        """The next offset this reader will yield."""
        return self._position

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def tier(self) -> str:
        """The phase the reader is in: "cloud", "wal" (replay or live) or "done"."""
        return self._phase

    @property
    def cloud_readers(self) -> list[CloudReader]:
        """Every cloud reader this reader used, in order (their fetch counters are kept)."""
        return list(self._cloud_readers)

    def close(self) -> None:
        """Stop reading; safe from any thread, idempotent. Iteration then raises ReaderClosed."""
        if self._closed:
            return
        self._closed = True
        if self._cloud is not None:
            self._cloud.close()
        self._close_wal_reader()
        self._pending.clear()

    def move_away(self, diverged_from: int | None = None) -> None:
        """The topic stops being served here: iteration (also one blocked waiting for
        live messages) ends with :class:`TopicMoved` carrying the next offset to read.

        ``diverged_from``: a failover replaced this broker's history from that offset on
        (this owner was fenced), so the offsets from there on now hold other messages on
        the new owner. A reader that got past it ends with :class:`HistoryDiverged`
        (a TopicMoved) whose ``next_offset`` is that offset, not its own position, so a
        consumer that resumes there reads the new owner's messages instead of skipping
        them. Safe from any thread, idempotent."""
        if diverged_from is not None and (self._diverged_from is None or diverged_from < self._diverged_from):
            self._diverged_from = diverged_from
        self._moved = True
        self.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> "TieredReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "TieredReader":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- sync iteration ----------------------------------------------------------
    def __iter__(self) -> Iterator[Message]:
        self._set_mode("sync")
        return self

    def __next__(self) -> Message:
        while True:
            self._check_open()
            if self._pending:
                return self._accept(self._pending.popleft())
            if self._phase == _PHASE_CLOUD:
                self._cloud_batch_checked()
            elif self._phase == _PHASE_WAL:
                message = self._next_wal_sync()
                if message is not None:
                    return self._accept(message)
            else:
                raise StopIteration

    # -- async iteration ---------------------------------------------------------
    def __aiter__(self) -> "TieredReader":
        self._set_mode("async")
        return self

    async def __anext__(self) -> Message:
        while True:
            self._check_open()
            if self._pending:
                return self._accept(self._pending.popleft())
            if self._phase == _PHASE_CLOUD:
                # Archive reads block on the network: one worker-thread hop per batch. The
                # thread itself queues the batch, and an await cancelled during a hop leaves
                # that hop to the next await (its batch, or its error, is not lost).
                hop = self._cloud_hop
                if hop is not None and hop.done():
                    self._cloud_hop = None
                    hop.result()  # the error of a hop whose await was cancelled; its batch is queued
                    continue
                if hop is None:
                    hop = self._cloud_hop = asyncio.ensure_future(asyncio.to_thread(self._cloud_batch_checked))
                try:
                    await asyncio.shield(hop)
                finally:
                    if hop.done():
                        self._cloud_hop = None
            elif self._phase == _PHASE_WAL:
                message = await self._next_wal_async()
                if message is not None:
                    return self._accept(message)
            else:
                raise StopAsyncIteration

    # -- phases ------------------------------------------------------------------
    def _initial_phase(self) -> str:
        if self.wal is None:
            end = topic_next_offset(self.topic, None, self.metadata) - 1
            return self._start_cloud(end) if self._position <= end else _PHASE_DONE
        wal_first = int(self.wal.first_offset)
        if self._position >= wal_first:
            return _PHASE_WAL
        return self._start_cloud(wal_first - 1)

    def _start_cloud(self, end_inclusive: int) -> str:
        self._cloud = CloudReader(self.topic, self.metadata, self.objects, self._position, end_inclusive,
                                  prefetch_objects=self.prefetch_objects,
                                  memory_bytes_max=self.memory_bytes_max, metrics=self.metrics)
        self._cloud_readers.append(self._cloud)
        if self._closed:
            # close() from another thread ran while this one fell back to the archive and
            # saw no cloud reader to close: close it here, or its first wait would not
            # see close() (close sets _closed before it reads _cloud).
            self._cloud.close()
        log.debug("reader of %s: cloud %d..%d", self.topic, self._position, end_inclusive)
        return _PHASE_CLOUD

    def _cloud_batch_checked(self) -> None:
        """``_cloud_batch``; a cloud reader closed because the topic moved away reports
        that (TopicMoved), not its own ReaderClosed."""
        try:
            self._cloud_batch()
        except ReaderClosed:
            self._check_open()
            raise

    def _cloud_batch(self) -> None:
        """Queue the next archive messages; at the end of the archive range, hand off to the WAL.

        Serialised by a lock: after a cancelled ``async`` hop, the next hop waits for the
        abandoned one (whose batch is queued) instead of racing it.
        """
        with self._io_lock:
            if self._pending or self._phase != _PHASE_CLOUD:
                return
            self._cloud_batch_locked()

    def _cloud_batch_locked(self) -> None:
        assert self._cloud is not None
        batch = self._cloud.next_batch(ASYNC_BATCH_MESSAGES if self._mode == "async" else SYNC_BATCH_MESSAGES)
        self._pending.extend(batch)
        if not batch:
            end = self._cloud.end
            self._cloud.close()
            self._cloud = None
            # Cloud -> WAL handoff: the archive must have served exactly up to its end.
            expected_next = self._position + len(self._pending)
            if expected_next != end + 1:
                raise DataGap(expected_next, end, "the archive ended early")
            self._phase = _PHASE_WAL if self.wal is not None else _PHASE_DONE

    def _open_wal(self) -> None:
        """Open the WAL at ``position``; below its retention, read the gap from the archive."""
        with self._io_lock:
            if self._wal_reader is None and self._phase == _PHASE_WAL:
                self._open_wal_locked()

    def _open_wal_locked(self) -> None:
        position = self._position
        assert self.wal is not None, "the WAL phase is entered only with a WAL"
        try:
            self._wal_reader = self.wal.reader(position, live=self.live)
        except OffsetBelowRetention as e:
            self._fall_back_to_cloud(e)
            return
        # Everything below the durable watermark now is a replay; above it is live.
        self._live_from = durable_next(self.wal)
        log.debug("reader of %s: WAL from %d (live from %d)", self.topic, position, self._live_from)

    def _fall_back_to_cloud(self, error: OffsetBelowRetention) -> None:
        """WAL retention removed the reader's position (at the handoff, or mid-stream
        under a reader slower than the uploader): read up to the WAL's new first offset
        from the archive, then try the WAL again. WAL retention removes only archived
        segments, so the archive holds that range; if it does not, the cloud reader says
        so (DataGap, or OffsetBelowArchiveStart where archive retention cut it), never a
        skip. Each fallback serves at least one message, so a reader that keeps losing the
        race to retention still advances; there is no limit on how often."""
        self._close_wal_reader()
        if error.first_offset <= self._position:
            raise error  # not retention of what this reader still needs: never hidden
        self._retention_retries += 1
        log.info("reader of %s: WAL now starts at %d; reading %d.. from the archive (fallback %d)",
                 self.topic, error.first_offset, self._position, self._retention_retries)
        self._phase = self._start_cloud(error.first_offset - 1)

    def _next_wal_sync(self) -> Message | None:
        if self._wal_reader is None:
            self._open_wal()
            if self._phase != _PHASE_WAL:
                return None
        if self._wal_iter is None:
            assert self._wal_reader is not None, "_open_wal opens it or leaves the WAL phase"
            self._wal_iter = iter(self._wal_reader)
        try:
            record = next(self._wal_iter)
        except StopIteration:
            if self._moved:
                self._check_open()
            self._phase = _PHASE_DONE
            return None
        except OffsetBelowRetention as e:
            self._wal_retention_error(e)
            return None
        except Exception:
            self._check_open()  # the WAL reader was closed because the topic moved away
            raise
        return self._wal_message(record)

    async def _next_wal_async(self) -> Message | None:
        if self._wal_reader is None:
            await asyncio.to_thread(self._open_wal)
            if self._phase != _PHASE_WAL:
                return None
        if self._wal_aiter is None:
            assert self._wal_reader is not None, "_open_wal opens it or leaves the WAL phase"
            self._wal_aiter = self._wal_reader.__aiter__()
        try:
            record = await self._wal_aiter.__anext__()
        except StopAsyncIteration:
            if self._moved:
                self._check_open()
            self._phase = _PHASE_DONE
            return None
        except OffsetBelowRetention as e:
            self._wal_retention_error(e)
            return None
        except Exception:
            self._check_open()
            raise
        return self._wal_message(record)

    def _wal_retention_error(self, error: OffsetBelowRetention) -> None:
        self._fall_back_to_cloud(error)

    def _wal_message(self, record: Record) -> Message:
        assert self._live_from is not None
        tier = TIER_WAL if record[0] < self._live_from else TIER_LIVE
        return Message.from_record(record, tier)

    def _close_wal_reader(self) -> None:
        reader, self._wal_reader, self._wal_iter, self._wal_aiter = self._wal_reader, None, None, None
        close = getattr(reader, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - closing is best effort; the reader is done
                log.debug("closing the WAL reader of %s failed", self.topic, exc_info=True)

    # -- checks ------------------------------------------------------------------
    def _accept(self, message: Message) -> Message:
        """The handoff assertion: every message is exactly position + 1 of the last one."""
        offset = message.offset
        if offset != self._position:
            self._phase = _PHASE_DONE
            if offset > self._position:
                raise DataGap(self._position, offset - 1, f"{message.tier} tier jumped to {offset}")
            raise OffsetOutOfOrder(self._position, offset, message.tier)
        self._position = offset + 1
        self._reads[message.tier].inc()
        self._served += 1
        if self._on_served is not None:
            self._on_served(len(message.payload) + (len(message.key) if message.key else 0))
        if self._served % LAG_SAMPLE_MESSAGES == 0 and self.wal is not None:
            lag = topic_gauge(self.metrics.registry, self.metrics.lag, self.topic)
            lag.set(max(0, int(self.wal.next_offset) - self._position))
        return message

    def _check_open(self) -> None:
        if self._moved:
            if self._diverged_from is not None and self._position > self._diverged_from:
                raise HistoryDiverged(str(self.topic), self._diverged_from, self._position)
            # The position when iteration stopped (a message fetched while moving away
            # was still served, so the resume point is where the consumer really is).
            raise TopicMoved(str(self.topic), self._position)
        if self._closed:
            raise ReaderClosed(f"reader of {self.topic} is closed")

    def _set_mode(self, mode: str) -> None:
        if self._mode not in (None, mode):
            raise RuntimeError(f"reader of {self.topic} is already iterated with {self._mode} iteration")
        self._mode = mode

    def __repr__(self) -> str:
        return f"TieredReader({self.topic}, position={self._position}, phase={self._phase})"


def durable_next(wal: WalOffsets) -> int:
    """One past the WAL's durable watermark (its last durable offset)."""
    durable = wal.durable_offset
    return int(wal.first_offset) if durable is None or durable < 0 else int(durable) + 1


def read_messages(reader: TieredReader, limit: int | None = None) -> list[Message]:
    """Everything ``reader`` yields (at most ``limit``), then close it: for readers created
    with ``live=False`` (a live reader never ends on its own without ``limit``)."""
    out: list[Message] = []
    with reader:
        for message in reader:
            out.append(message)
            if limit is not None and len(out) >= limit:
                break
    return out


__all__ = ["TieredReader", "create_reader", "earliest_offset", "read_messages", "resolve_start", "topic_next_offset"]
