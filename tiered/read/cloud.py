"""CloudReader: serve an offset range from archived dnb1 objects.

How a range ``[start, end]`` is read (``end`` inclusive):

1. The committed descriptors are paged in offset order (``tiered.archive.chain``) and the
   ones overlapping the range are picked. A hole between them, or before/after them
   inside the range, is a :class:`DataGap` naming the missing offsets, raised when the
   reader reaches it (everything before it is served).
2. For each object, ONE suffix-range GET fetches the trailer and footer (a second ranged
   GET only when the footer is larger than ``footer_guess_bytes``). The footer's block
   index says which byte range holds which offsets.
3. Only the blocks that overlap the range are fetched, with ranged GETs of contiguous
   runs of blocks, each run at most ``chunk_bytes_max``. A read from the middle of an
   object never downloads the whole object.
4. While one object is consumed, the next ``prefetch_objects`` objects are prepared
   (footer + first run of blocks) by a background thread. Memory stays bounded: at most
   one run in decoding plus one prepared run per prefetched object, each at most
   ``chunk_bytes_max = memory_bytes_max // (prefetch_objects + 1)`` (a single block larger
   than that is still fetched whole, because a block cannot be split).
5. No GET runs on the consumer's thread: each object is prepared, and each later run of
   it fetched, on a daemon thread of its own that the consumer waits on. It waits for the
   GET *or* ``close()``, whichever comes first, so a reader closed while the object store
   stalls (a long poll's deadline, a topic moving away) raises :class:`ReaderClosed` at
   once; the stalled GET finishes on its thread, which ``close()`` abandoned, and its
   bytes are dropped. Each wait is bounded by ``fetch_timeout_s`` (:class:`ReadTimeout`).
   An abandoned GET lives as long as the store's own request timeout lets it (S3:
   ``object_store.read_timeout_s``; a local directory has none), and never holds up
   the process's exit. While a store stalls, every retried read would abandon more of
   them, so at most ``GETS_IN_FLIGHT_MAX`` GETs run at once per object store, across
   every reader of the process: a read that finds them all taken waits for one (up to
   ``fetch_timeout_s``, then :class:`ReadTimeout`; or ``close()``), and starts no
   thread meanwhile.

Before a byte is served the object is checked against its descriptor
(``tiered.archive.fetch``): the footer GET also returns the object's total size, which
must equal the descriptor's ``size``; the footer's CRC32C must be the descriptor's
``footer_crc32c``, and every fetched block's CRC32C the descriptor's entry for it in
``block_crc32c`` (the codec then checks each CRC against the bytes); when the first block
is fetched the header comes with it and must be valid and agree with the footer (read
from the middle, the header is not fetched: every byte served is pinned without it). So an object
replaced after its commit, by whatever writer, is a :class:`CorruptArchive` naming its
key, never data. Every record is checked too: offsets
are contiguous across blocks and objects, each block holds exactly the offsets its footer
entry names, and each object exactly the offsets its descriptor names. Damage is a :class:`CorruptArchive` (with the codec's
``CorruptObject`` as cause); nothing from a damaged block is served.

Archive retention may overtake a reader (the owner raises the archive start, then deletes
descriptors, then objects). Whenever the reader would raise a :class:`DataGap` (a missing
descriptor or a missing object), it re-reads the archive start first: when the start has
passed the next offset to serve, it raises
:class:`~tiered.archive.start.OffsetBelowArchiveStart` (that offset, the first retained
one) instead; otherwise the ``DataGap`` stands. Nothing is skipped either way.

Counters (``gets``, ``footer_gets``, ``block_gets``, ``bytes_fetched``,
``blocks_fetched``, ``objects_opened``) are plain attributes so tests can assert what
was fetched without timing anything.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from native.errors import CodecError, CorruptObject
from native.format import Record
from tiered.archive import fetch
from tiered.archive.chain import DescriptorChain
from tiered.archive.fetch import Block, Footer, ObjectPin
from tiered.archive.naming import descriptor_object_key
from tiered.archive.start import OffsetBelowArchiveStart, archive_start
from tiered.errors import ObjectNotFound
from tiered.read.messages import TIER_CLOUD, Message
from tiered.metadata import keys
from tiered.metadata.base import MetadataStore
from tiered.objects.base import ByteRequest, ObjectStore, RangeByteRequest
from tiered.read.errors import CorruptArchive, DataGap, ReaderClosed, ReadTimeout
from tiered.read.metrics import ReadMetrics
from wal.topics import TopicName

log = logging.getLogger(__name__)
T = TypeVar("T")


MEMORY_BYTES_MAX_DEFAULT = 64 << 20
FOOTER_GUESS_BYTES_DEFAULT = 64 << 10
#: Bound on waiting for one prepared object (footer + first run) from the prefetcher, or
#: for one later run of blocks from the fetcher.
FETCH_TIMEOUT_S_DEFAULT = 120.0
_DESCRIPTOR_PAGE = 256
#: GETs running at once on one object store, across every reader of the process (see the
#: module docstring, 5.).
GETS_IN_FLIGHT_MAX = 128


class _InFlight:
    """How many of one store's GETs are running on their own threads."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()

    def release(self) -> None:
        with self.changed:
            self.count -= 1
            self.changed.notify()


_in_flight_by_store: "weakref.WeakKeyDictionary[object, _InFlight]" = weakref.WeakKeyDictionary()
_in_flight_shared = _InFlight()  # for a store that cannot be weakly referenced
_in_flight_lock = threading.Lock()


def _in_flight(store: object) -> _InFlight:
    with _in_flight_lock:
        try:
            found = _in_flight_by_store.get(store)
            if found is None:
                found = _in_flight_by_store[store] = _InFlight()
            return found
        except TypeError:
            return _in_flight_shared


@dataclass(frozen=True, slots=True)
class _Run:
    """Contiguous blocks fetched with one ranged GET: bytes ``[position, end)``."""

    blocks: tuple[Block, ...]
    position: int
    end: int


@dataclass(slots=True)
class _Prepared:
    """One object ready to consume: its runs, and the bytes of the first one."""

    descriptor: keys.ObjectDescriptor
    pin: ObjectPin
    key: str
    footer: Footer
    runs: list[_Run]
    first_run_data: bytes | None


class CloudReader:
    """Iterates :class:`Message` (tier ``"cloud"``) for ``[start, end_inclusive]``.

    Not thread-safe for consumers (one consumer at a time); ``close()`` may be called
    from any thread. See the module docstring for the fetch plan and bounds.
    """

    def __init__(self, topic: TopicName | str, metadata: MetadataStore, objects: ObjectStore,
                 start: int, end_inclusive: int, *, prefetch_objects: int = 1,
                 memory_bytes_max: int = MEMORY_BYTES_MAX_DEFAULT,
                 footer_guess_bytes: int = FOOTER_GUESS_BYTES_DEFAULT,
                 fetch_timeout_s: float = FETCH_TIMEOUT_S_DEFAULT, metrics: ReadMetrics | None = None) -> None:
        if start < 0 or prefetch_objects < 0 or memory_bytes_max <= 0 or footer_guess_bytes < 64:
            raise ValueError("need start >= 0, prefetch_objects >= 0, positive memory and footer guess")
        self.topic = TopicName.parse(topic)
        self.metrics = metrics if metrics is not None else ReadMetrics.create()
        self.metadata = metadata
        self.objects = objects
        self.start = start
        self.end = end_inclusive
        self.prefetch_objects = prefetch_objects
        self.chunk_bytes_max = max(1, memory_bytes_max // (prefetch_objects + 1))
        self.footer_guess_bytes = footer_guess_bytes
        self.fetch_timeout_s = fetch_timeout_s
        self.position = start  # next offset this reader will yield
        # Counters for tests and the demo; updated under a lock (the prefetcher counts too).
        self.gets = self.footer_gets = self.block_gets = 0
        self.bytes_fetched = self.blocks_fetched = self.objects_opened = 0
        self._count_lock = threading.Lock()
        self._closed = False
        self._deferred: Exception | None = None
        # Done once close() is called: what a waiting consumer waits on besides
        # its GET. A Future, so that concurrent.futures.wait takes both.
        self._close_signal: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._messages = self._generate() if start <= end_inclusive else iter(())

    # -- iteration -------------------------------------------------------------
    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        if self._closed:
            raise ReaderClosed(f"cloud reader of {self.topic} is closed")
        if self._deferred is not None:
            error, self._deferred = self._deferred, None
            raise error
        message = next(self._messages)
        self.position = message.offset + 1
        return message

    def next_batch(self, count_max: int) -> list[Message]:
        """Up to ``count_max`` messages (fewer only at the end); for thread hops in async code."""
        batch: list[Message] = []
        try:
            for message in self:
                batch.append(message)
                if len(batch) >= count_max:
                    break
        except Exception as e:  # noqa: BLE001 - re-raised on the next call, see below
            if not batch:
                raise
            # Serve what came before the error first; the error follows on the next call.
            self._deferred = e
        return batch

    def close(self) -> None:
        self._closed = True
        try:
            # Wakes a consumer waiting for a GET. (Not cancel(): a cancelled Future does not
            # wake concurrent.futures.wait until an executor notifies it.)
            self._close_signal.set_result(None)
        except concurrent.futures.InvalidStateError:
            pass  # closed before
        close = getattr(self._messages, "close", None)
        if close is not None:
            try:
                close()
            except ValueError:
                pass  # "generator already executing": the consumer thread will see _closed.

    def __enter__(self) -> "CloudReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pipeline ----------------------------------------------------------
    def _generate(self) -> Iterator[Message]:
        """The messages; a gap that archive retention explains is OffsetBelowArchiveStart."""
        try:
            yield from self._generate_range()
        except DataGap as gap:
            # ``position`` is the next offset to serve (everything before it was served).
            first = archive_start(self.metadata, self.topic)
            if first > self.position:
                raise OffsetBelowArchiveStart(self.topic, self.position, first) from gap
            raise

    def _generate_range(self) -> Iterator[Message]:
        expected = self.start
        pending: list[concurrent.futures.Future[_Prepared] | _Prepared] = []
        descriptors = self._covering()
        previous_end: int | None = None
        while expected <= self.end:
            self._fill(pending, descriptors, self.prefetch_objects + 1)
            if not pending:
                raise DataGap(expected, self.end, f"no archived object covers them (topic {self.topic})")
            prepared = self._take(pending.pop(0))
            if prepared.descriptor.start_offset > expected:
                raise DataGap(expected, prepared.descriptor.start_offset - 1,
                              f"no archived object covers them (topic {self.topic})")
            if previous_end is not None and prepared.descriptor.start_offset <= previous_end:
                # Two objects claim the same offsets (damaged or hostile metadata): which
                # history is the topic's cannot be told, so neither is picked silently.
                raise CorruptArchive(prepared.key, f"starts at offset {prepared.descriptor.start_offset}, inside the "
                                     f"previous object (which ends at {previous_end}): overlapping descriptors")
            previous_end = prepared.descriptor.end_offset
            # Start the next objects before consuming this one: with it, the current one
            # plus ``prefetch_objects`` more are prepared or in flight, never more.
            self._fill(pending, descriptors, self.prefetch_objects)
            for message in self._object_messages(prepared, expected):
                yield message
                expected = message.offset + 1
            if expected <= min(prepared.descriptor.end_offset, self.end):
                raise CorruptArchive(prepared.key, f"served up to {expected - 1}, descriptor says "
                                     f"{prepared.descriptor.end_offset}")

    def _fill(self, pending: list[concurrent.futures.Future[_Prepared] | _Prepared],
              descriptors: Iterator[keys.ObjectDescriptor], depth: int) -> None:
        """Keep ``depth`` objects prepared or in flight in ``pending``."""
        while len(pending) < depth:
            descriptor = next(descriptors, None)
            if descriptor is None:
                return
            pending.append(self._detached("dnb-prefetch", self._prepare, descriptor))

    def _detached(self, name: str, fn: Callable[..., T], *args: Any) -> "concurrent.futures.Future[T]":
        """``fn(*args)`` on a thread of its own, as a Future (see the module docstring, 5.).

        A daemon thread, not an executor's: ``concurrent.futures`` joins its workers at
        interpreter exit, so a GET that a closed reader abandoned on a stalled store would
        hold the process's exit until the store answered. At most ``prefetch_objects + 1``
        of a reader's GETs run at once (``_fill`` keeps that many pending, and a later run
        is asked for once the one before it was decoded)."""
        if self._closed:
            raise ReaderClosed(f"cloud reader of {self.topic} was closed")
        slots = self._take_get_slot()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                if not future.set_running_or_notify_cancel():
                    return  # cancelled before it started
                try:
                    result = fn(*args)
                except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
                    future.set_exception(e)
                else:
                    future.set_result(result)
            finally:
                slots.release()

        try:
            threading.Thread(target=run, name=f"{name}{self.topic}", daemon=True).start()
        except BaseException:
            slots.release()
            raise
        return future

    def _take_get_slot(self) -> _InFlight:
        """One of the store's ``GETS_IN_FLIGHT_MAX`` GETs, waiting for it while all run (up
        to ``fetch_timeout_s``: ReadTimeout; or until ``close()``: ReaderClosed)."""
        slots = _in_flight(self.objects)
        deadline = time.monotonic() + self.fetch_timeout_s
        with slots.changed:
            while slots.count >= GETS_IN_FLIGHT_MAX:
                if self._closed:
                    raise ReaderClosed(f"cloud reader of {self.topic} was closed")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReadTimeout(f"{slots.count} GETs to the object store are still running (a stalled "
                                      f"store?); none ended within {self.fetch_timeout_s}s for {self.topic}")
                slots.changed.wait(min(left, 0.1))  # re-checks close() at least this often
            slots.count += 1
        return slots

    def _take(self, item: "concurrent.futures.Future[_Prepared] | _Prepared") -> _Prepared:
        if isinstance(item, _Prepared):
            return item
        return self._await(item, "preparing an archived object")

    def _await(self, future: "concurrent.futures.Future[T]", what: str) -> T:
        """The future's result, or ReaderClosed as soon as close() is called, whichever
        comes first (a GET that stalls must not hold the consumer past close()); at most
        ``fetch_timeout_s`` (ReadTimeout)."""
        either: tuple[concurrent.futures.Future[Any], ...] = (future, self._close_signal)
        done, _ = concurrent.futures.wait(either, timeout=self.fetch_timeout_s,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        if self._closed:
            future.cancel()  # if it has not started: its GET is never made
            raise ReaderClosed(f"cloud reader of {self.topic} was closed")
        if future not in done:
            raise ReadTimeout(f"{what} of {self.topic} took over {self.fetch_timeout_s}s")
        try:
            return future.result()
        except concurrent.futures.CancelledError as e:
            raise ReaderClosed(f"cloud reader of {self.topic} was closed") from e

    def _covering(self) -> Iterator[keys.ObjectDescriptor]:
        """Descriptors overlapping [start, end] in offset order (paged, lazily)."""
        return DescriptorChain(self.metadata, self.topic, page_keys=_DESCRIPTOR_PAGE).covering(self.start, self.end)

    # -- one object --------------------------------------------------------------
    def _prepare(self, descriptor: keys.ObjectDescriptor) -> _Prepared:
        """Footer + block plan + the first run's bytes (runs in the prefetch thread)."""
        key = descriptor_object_key(self.topic, descriptor)
        pin = ObjectPin.of(descriptor)
        try:
            footer = fetch.read_footer(_Counted(self), key, descriptor.size, pin, guess_bytes=self.footer_guess_bytes)
            fetch.check_footer(key, footer, self.topic, descriptor.start_offset, descriptor.end_offset)
            runs = self._plan_runs(key, descriptor, footer)
            first = self._fetch_run(key, runs[0]) if runs else None
            if first is not None and runs[0].position == 0:
                fetch.check_header(key, first, footer)
        except ObjectNotFound as e:
            raise DataGap(descriptor.start_offset, descriptor.end_offset,
                          f"object {key!r} named by a committed descriptor is missing") from e
        except CorruptObject as e:
            raise CorruptArchive(key, f"{e.reason} at byte {e.position}") from e
        except (CodecError, ValueError) as e:  # bytes the codec could not even frame
            raise CorruptArchive(key, f"not a valid dnb1 object: {e}") from e
        with self._count_lock:
            self.objects_opened += 1
        return _Prepared(descriptor, pin, key, footer, runs, first)

    def _plan_runs(self, key: str, descriptor: keys.ObjectDescriptor, footer: Footer) -> list[_Run]:
        lo, hi = max(self.start, descriptor.start_offset), min(self.end, descriptor.end_offset)
        needed = [b for b in footer.blocks if b.last_offset >= lo and b.first_offset <= hi]
        runs: list[_Run] = []
        current: list[Block] = []
        for block in needed:
            if current and (block.position != current[-1].end
                            or block.end - current[0].position > self.chunk_bytes_max):
                runs.append(_Run(tuple(current), current[0].position, current[-1].end))
                current = []
            current.append(block)
        if current:
            runs.append(_Run(tuple(current), current[0].position, current[-1].end))
        if runs and runs[0].position == footer.header_bytes:
            # The object's first block: its header comes with it (a few dozen bytes more)
            # and is checked against the footer (``_prepare``).
            runs[0] = _Run(runs[0].blocks, 0, runs[0].end)
        return runs

    def _fetch_run(self, key: str, run: _Run) -> bytes:
        data = self._get(key, "block", RangeByteRequest(run.position, run.end), len(run.blocks))
        if len(data) != run.end - run.position:
            raise CorruptArchive(key, f"ranged GET {run.position}-{run.end - 1} returned {len(data)} bytes")
        return data

    def _get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        """The footer GET: the last ``length`` bytes and the object's total size; counted."""
        if self._closed:
            raise ReaderClosed(f"cloud reader of {self.topic} is closed")
        data, size = self.objects.get_tail(key, length)
        self._count(key, "footer", data, 0)
        return data, size

    def _get(self, key: str, kind: str, byte_range: ByteRequest, amount: int) -> bytes:
        """One ranged GET; counted."""
        if self._closed:
            raise ReaderClosed(f"cloud reader of {self.topic} is closed")
        data = self.objects.get_range(key, byte_range)
        self._count(key, kind, data, amount)
        return data

    def _count(self, key: str, kind: str, data: bytes, amount: int) -> None:
        with self._count_lock:
            self.gets += 1
            self.bytes_fetched += len(data)
            if kind == "footer":
                self.footer_gets += 1
            else:
                self.block_gets += 1
                self.blocks_fetched += amount
        self.metrics.cloud_gets.labels(kind).inc()
        self.metrics.cloud_bytes.inc(len(data))

    def _object_messages(self, prepared: _Prepared, expected: int) -> Iterator[Message]:
        for index, run in enumerate(prepared.runs):
            first = prepared.first_run_data if index == 0 else None
            data = first if first is not None else self._fetch_run_mapped(prepared, run)
            prepared.first_run_data = None  # let the first run's bytes go once consumed
            for block in run.blocks:
                records = self._decode(prepared, data, run.position, block)
                for record in records:
                    offset = record[0]
                    if offset < expected:
                        continue  # the first block may start before the range
                    if offset > self.end:
                        return
                    if offset != expected:
                        raise CorruptArchive(prepared.key, f"offset {offset} where {expected} was expected")
                    yield Message.from_record(record, TIER_CLOUD)
                    expected += 1

    def _fetch_run_mapped(self, prepared: _Prepared, run: _Run) -> bytes:
        """A later run of the object, fetched on the fetcher thread: a GET that stalls
        holds that thread, not the consumer, which close() frees at once (``_await``).
        Sequential (the next run is asked for once this one is decoded), so the memory
        bound is unchanged."""
        try:
            return self._await(self._detached("dnb-fetch", self._fetch_run, prepared.key, run),
                               f"fetching blocks of archived object {prepared.key!r}")
        except ObjectNotFound as e:
            raise DataGap(run.blocks[0].first_offset, prepared.descriptor.end_offset,
                          f"object {prepared.key!r} vanished while being read") from e

    @staticmethod
    def _decode(prepared: _Prepared, data: bytes, base: int, block: Block) -> list[Record]:
        key = prepared.key
        view = memoryview(data)[block.position - base:block.end - base]
        try:
            return fetch.block_records(key, view, block, prepared.pin)
        except CorruptObject as e:
            raise CorruptArchive(key, f"block at byte {block.position}: {e.reason} (at byte {e.position})") from e
        except (CodecError, ValueError) as e:
            raise CorruptArchive(key, f"block at byte {block.position}: {e}") from e


class _Counted:
    """The reader's object store as :func:`fetch.read_footer` sees it: every GET is counted
    (a footer GET and, for a footer larger than the guess, its front part)."""

    def __init__(self, reader: CloudReader) -> None:
        self._reader = reader

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        return self._reader._get_tail(key, length)

    def get_range(self, key: str, byte_range: ByteRequest) -> bytes:
        return self._reader._get(key, "footer", byte_range, 0)


__all__ = ["CloudReader", "MEMORY_BYTES_MAX_DEFAULT"]
