# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython twin of ``native/_append_py.py``: ``AppendBuffer``, the WAL's append core.

Offsets, encoding and the pending buffer in one atomic C step (see the class docstring). The
frames are encoded with the C-level API of ``native/_frames.pyx`` (``native/_frames.pxd``),
the same code that ``native.encode_batch`` runs, so the bytes are the format's by
construction; the twin-equality tests compare them with the pure-Python twin's anyway.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, _PyBytes_Resize
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport free, malloc
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from native._frames cimport (
    FRAME_HDR,
    MAX_RECORD,
    RECORD_FIXED,
    MsgInfo,
    as_u64,
    measure_body,
    write_frames,
)

from native.errors import CodecError, OffsetOverflow
from native.format import MAX_OFFSET as _PY_MAX_OFFSET

IMPLEMENTATION = "cython"

__all__ = ["AppendBuffer", "PendingBudget"]

cdef uint64_t MAX_OFFSET = _PY_MAX_OFFSET  # 2**63 - 1, see native/format.py


cdef inline uint64_t _clock_ms() noexcept nogil:
    """Wall clock in ms since the epoch, the same reading as ``time.time_ns() // 1_000_000``."""
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <uint64_t>ts.tv_sec * 1000 + <uint64_t>(ts.tv_nsec // 1000000)


cdef enum:
    # Pending frames live in chunks of APPEND_CHUNK_MIN to APPEND_CHUNK bytes (a batch larger
    # than APPEND_CHUNK gets a chunk of its own). The first chunk after a take() is sized by
    # what that take() held, later ones double: a topic that gets one small message per
    # commit round allocates a few KiB per round, not APPEND_CHUNK.
    APPEND_CHUNK_MIN = 4 * 1024
    APPEND_CHUNK = 1024 * 1024
    # A chunk at most half full, up to this many bytes, is copied out at its size when
    # sealed instead of shrunk in place (see _seal_chunk).
    SEAL_COPY_MAX = 64 * 1024
    # Under a shared budget (PendingBudget), which counts frames and not the chunks they sit
    # in, no chunk is larger than this unless one batch needs it (then it is exactly that
    # batch's size): what a core holds beyond its frames stays under 64 KiB. With chunks of
    # up to 1 MiB, one small message pending behind a stalled disk held 1 MiB at every
    # once-busy topic (898 MB at 1,000 topics behind a 1 MiB budget, atk85 F1), and chunks
    # that doubled after a small first one held up to 3 times what was counted (atk86 F1).
    SHARED_CHUNK_MAX = 64 * 1024


cdef class PendingBudget:
    """Pending bytes that many append cores count together (a commit group's bound on what
    all its topics hold appended but not yet taken by the writer: ``wal.group``).

    Each core constructed with ``shared=`` this budget adds every frame it counts and
    subtracts what ``take()`` hands over or ``leave_shared()`` gives back, in the same atomic
    step as its own count; an append finding ``used >= bytes_max``, or appends ``waiting``
    with ``used >= resume_bytes`` (``must_wait``), calls its ``wait_for_room`` first, as for the core's own bound (so ``used`` passes
    ``bytes_max`` by at most what the appends already past that check add). Only the cores of
    this twin can share it; the Python twin has its own (native/_append_py.py)."""
    cdef readonly Py_ssize_t used, bytes_max
    #: Appends waiting for room (set by their waiting side, ``wal.group``): while any wait,
    #: every append calls ``wait_for_room`` first and queues behind them, so appends that
    #: never waited cannot take the room from those that do.
    cdef public Py_ssize_t waiting
    #: While appends wait, newcomers join them only at or above this (seven eighths of
    #: ``bytes_max``): below it there is room for all, and the line empties.
    cdef readonly Py_ssize_t resume_bytes

    def __init__(self, bytes_max):
        if bytes_max <= 0:
            raise ValueError("bytes_max must be positive")
        self.bytes_max = bytes_max
        self.resume_bytes = bytes_max - bytes_max // 8
        self.used = 0
        self.waiting = 0

    @property
    def must_wait(self):
        """Whether an append calls ``wait_for_room`` first: the budget is full, or appends
        wait and it is nearly full."""
        return self.used >= self.bytes_max or (self.waiting > 0 and self.used >= self.resume_bytes)

    @property
    def full(self):
        """Whether the budget is full."""
        return self.used >= self.bytes_max


cdef class AppendBuffer:
    """Allocates offsets and keeps the encoded frames the WAL writer has not taken yet.

    ``append`` validates a message, then allocates its offset, encodes its frame (C encoder, C
    CRC32C) straight into its pending chunk and counts it, as ONE atomic step: that part runs
    without releasing the GIL and without calling any Python code, so no other Python thread
    can observe or interleave with it. That is what keeps offsets unique, contiguous and in
    buffer (= file) order with any number of appending threads, with no lock. ``busy`` is set
    for exactly that step and checked on entry; finding it set means Python code ran inside
    the step (a bug), which raises instead of corrupting the buffer. The pure-Python twin
    (native/_append_py.py) gets the same guarantee from a lock.

    Python is called back only on rare paths, never per message in steady state:
    ``wait_for_room()`` before appending while ``pending_bytes >= pending_bytes_max``
    (backpressure, bounded by the caller), ``wake()`` after appending when the writer parked
    itself idle or ``pending_bytes`` just crossed ``batch_bytes``, ``refusal()`` (a factory of
    the exception to raise, set once appends must be refused), ``too_large(message)`` for a
    record over ``max_message_bytes``, and ``normalize(message)`` for batch elements that are
    neither bytes nor a tuple. Callbacks run outside the atomic step.

    Frames are encoded in place into bytes chunks (a batch never spans chunks, so it can be
    written past the counted end and counted only once whole; a batch larger than the chunk
    size gets a chunk of its own). Chunk sizes adapt: the first chunk after a take() is the
    power of two that would have held that take() (at least APPEND_CHUNK_MIN, at most
    APPEND_CHUNK), each further one twice the last, up to APPEND_CHUNK. A fixed APPEND_CHUNK
    cost every idle topic a 1 MiB allocation (and its page faults) per commit round for one
    small message; a busy topic still reaches APPEND_CHUNK in its first chunk. ``take()``
    hands the writer every chunk in one call without copying them (the last one is shrunk in
    place, or copied out when small and mostly empty: ``_seal_chunk``), ready for writev; copying tens of MB per group commit into fresh memory cost more
    than encoding them. It also says where the newest frames that fit
    ``tail_messages_max``/``tail_bytes_max`` start, so the WAL's cache of recent frames keeps
    working when one take holds thousands of records (the cache keeps those chunks as they
    are, wal/cache.py).
    """
    cdef list chunks              # full chunks, in offset order
    cdef object cur               # the chunk being filled (refcount 1, never exposed) or None
    cdef uint8_t *buf             # PyBytes_AS_STRING(cur)
    cdef Py_ssize_t cur_used, cap # bytes counted in cur / its size
    cdef Py_ssize_t chunk_next    # size of the next chunk to allocate (before fitting a batch)
    cdef Py_ssize_t used          # pending bytes across chunks and cur
    cdef uint64_t next_off        # the offset the next append gets
    cdef uint64_t first_off       # offset of the first pending frame (== next_off when empty)
    cdef Py_ssize_t count         # pending records; first_off + count == next_off
    cdef Py_ssize_t *ring         # start position of pending frame i at ring[i % tail_cap]
    cdef Py_ssize_t tail_cap, tail_bytes_max
    cdef readonly Py_ssize_t max_message_bytes, pending_bytes_max, batch_bytes
    cdef bint idle, in_step
    cdef object refusal_factory, wake_cb, wait_for_room_cb, too_large_cb, normalize_cb
    cdef PendingBudget shared     # counted together with other cores' pending bytes, or None

    def __cinit__(self):
        self.buf = NULL
        self.ring = NULL
        self.chunks = []
        self.cur = None
        self.used = self.cur_used = self.cap = 0
        self.chunk_next = APPEND_CHUNK_MIN

    def __init__(self, next_offset, *, max_message_bytes, pending_bytes_max, batch_bytes,
                 tail_messages_max, tail_bytes_max, wake, wait_for_room, too_large,
                 normalize, shared=None):
        self.next_off = self.first_off = as_u64(next_offset, "next_offset")
        if self.next_off > MAX_OFFSET + 1:
            raise OffsetOverflow(f"next_offset {self.next_off} is past MAX_OFFSET {MAX_OFFSET} + 1")
        self.count = 0
        if not 1 <= max_message_bytes <= MAX_RECORD:
            raise ValueError(f"max_message_bytes must be in [1, {MAX_RECORD}]")
        if pending_bytes_max < max_message_bytes or batch_bytes <= 0:
            raise ValueError("pending_bytes_max must hold one maximal message, batch_bytes > 0")
        if tail_messages_max <= 0 or tail_bytes_max <= 0:
            raise ValueError("tail_messages_max and tail_bytes_max must be positive")
        self.max_message_bytes = max_message_bytes
        self.pending_bytes_max = pending_bytes_max
        self.batch_bytes = batch_bytes
        self.tail_cap = tail_messages_max
        self.tail_bytes_max = tail_bytes_max
        free(self.ring)
        self.ring = <Py_ssize_t *>malloc(self.tail_cap * sizeof(Py_ssize_t))
        if self.ring == NULL:
            raise MemoryError()
        self.idle = self.in_step = False
        self.refusal_factory = None
        self.wake_cb = wake
        self.wait_for_room_cb = wait_for_room
        self.too_large_cb = too_large
        self.normalize_cb = normalize
        self.shared = shared  # a TypeError unless None or this twin's PendingBudget

    def __dealloc__(self):
        free(self.ring)

    # -------------------------------------------------------------- the atomic step
    cdef inline int _enter(self) except -1:
        if self.in_step:
            raise AssertionError("AppendBuffer re-entered: Python code ran inside the atomic step")
        if self.first_off + <uint64_t>self.count != self.next_off or self.cur_used > self.cap:
            raise AssertionError("AppendBuffer counters disagree")
        self.in_step = True
        return 0

    cdef inline int _leave(self) except -1:
        # Paired with _enter; a mismatch here would mean two steps overlapped.
        if not self.in_step or self.first_off + <uint64_t>self.count != self.next_off:
            self.in_step = False
            raise AssertionError("AppendBuffer step left in an inconsistent state")
        self.in_step = False
        return 0

    cdef int _seal_chunk(self) except -1:
        """Moves the filled part of ``cur`` to ``chunks``: shrunk in place (no copy), or,
        when at most half of it is filled and that part is small, copied out at its size.

        Why the copy: shrinking a malloc'd block in place splits it, and the freed rest can
        never hold the next chunk of the same size. A topic taking one small message per
        commit round (many topics, each with a little traffic) then left a 4 KiB hole per
        round behind every cached message: 1,000 topics at 20,000 msg/s grew the heap by
        80 MB/s, 3.9 KiB per 100 B message (``bench/bench_latency.py``'s RSS column: 2,482
        MiB after a 30 s run, 314 MiB copied out). Copied out, the chunk is freed whole and
        the next allocation takes it back; the smallest chunk (APPEND_CHUNK_MIN) is kept
        instead, emptied, for the next round (see below)."""
        cdef PyObject *raw
        if self.cur is None:
            return 0
        if self.cur_used == 0:
            self.cur = None  # nothing in it; a new one is allocated when needed
        elif self.cur_used <= self.cap // 2 and self.cur_used <= SEAL_COPY_MAX:
            self.chunks.append(PyBytes_FromStringAndSize(<char *>self.buf, self.cur_used))
            if self.cap <= APPEND_CHUNK_MIN:
                # Kept, emptied, for the next round's frames (never exposed, so reusable).
                # Freed, the smallest chunk cost a page fault per topic per round: a round
                # of 1,000 topics frees 1,000 of them at once, glibc then gives the heap's
                # top back to the kernel (its trim threshold is 128 KiB), and the next
                # round's appends fault it in again (4 us per append at 1,000 topics
                # instead of 0.35). A once-busy topic so keeps at most 4 KiB.
                self.cur_used = 0
                return 0
            self.cur = None  # freed whole
        else:
            # _PyBytes_Resize needs the only reference: take it over from self.cur.
            raw = <PyObject *>self.cur
            Py_INCREF(<object>raw)
            self.cur = None
            if self.cur_used != self.cap:
                _PyBytes_Resize(&raw, self.cur_used)  # on failure it has released raw
            self.chunks.append(<object>raw)
            Py_DECREF(<object>raw)
        self.buf = NULL
        self.cur_used = self.cap = 0
        return 0

    cdef uint8_t *_reserve(self, Py_ssize_t n) except NULL:
        """Room for n more bytes in ``cur`` at cur_used (not counted until _write counts it)."""
        cdef Py_ssize_t size
        cdef Py_ssize_t limit = APPEND_CHUNK if self.shared is None else SHARED_CHUNK_MAX
        if self.cur is None or self.cur_used + n > self.cap:
            self._seal_chunk()
            size = self.chunk_next
            while size < n and size < limit:
                size *= 2
            if size < n:
                size = n  # a batch larger than the limit: a chunk of its own, exactly its size
            self.cur = PyBytes_FromStringAndSize(NULL, size)
            self.buf = <uint8_t *>PyBytes_AS_STRING(self.cur)
            self.cap = size
            # Geometric growth within a round: many small chunks only while a round is small.
            self.chunk_next = size * 2 if size < limit // 2 else limit
        return self.buf + self.cur_used

    cdef int _write(self, MsgInfo *infos, Py_ssize_t n, Py_ssize_t total) except -1:
        """Encodes n measured messages at the next offsets and counts them; the atomic step.

        Frames are written past ``used`` first and counted only once all are written, so an
        error half-way (a record that changed since measuring) leaves nothing behind.
        """
        cdef Py_ssize_t i, pos
        if self.refusal_factory is not None:
            raise self.refusal_factory()
        # next_off <= MAX_OFFSET + 1 = 2**63 (checked at construction), so the sum cannot
        # wrap a u64 for any n a Py_ssize_t can hold.
        if self.next_off + <uint64_t>(n - 1) > MAX_OFFSET:
            raise OffsetOverflow(f"offset {self.next_off + <uint64_t>(n - 1)} would pass MAX_OFFSET "
                                 f"{MAX_OFFSET}: the topic is full")
        self._enter()
        try:
            write_frames(infos, n, self.next_off, self._reserve(total), total)
            pos = self.used
            for i in range(n):
                self.ring[(self.count + i) % self.tail_cap] = pos
                pos += FRAME_HDR + infos[i].record_len
            self.cur_used += total
            self.used += total
            if self.shared is not None:
                self.shared.used += total
            self.count += n
            self.next_off += <uint64_t>n
        finally:
            self._leave()
        return 0

    cdef inline bint _should_wake(self, Py_ssize_t added) noexcept:
        """After counting ``added`` bytes: wake the writer if it is parked or a batch is full.

        Only the crossing of batch_bytes wakes it: a writer that is busy re-checks the
        threshold under the WAL lock before it waits, so later appends need not notify.
        """
        if self.idle or (self.used - added < self.batch_bytes <= self.used):
            self.idle = False
            return True
        return False

    cdef int _check_size(self, const MsgInfo *m) except -1:
        if m.record_len > self.max_message_bytes:
            raise self.too_large_cb(f"record of {m.record_len} bytes exceeds max_message_bytes "
                                    f"{self.max_message_bytes}")
        return 0

    # -------------------------------------------------------------- appends
    def append(self, payload, key=None, attributes=None, publish_time=None):
        """Appends one message; returns its offset."""
        cdef MsgInfo m
        cdef list keep
        cdef uint64_t offset
        if self.used >= self.pending_bytes_max or (self.shared is not None and (
                self.shared.used >= self.shared.bytes_max
                or (self.shared.waiting > 0 and self.shared.used >= self.shared.resume_bytes))):
            self.wait_for_room_cb()
        m.publish_time = _clock_ms() if publish_time is None else as_u64(publish_time, "publish_time")
        if type(payload) is bytes and key is None and attributes is None:
            # The common case measured inline: no list, no dict walk.
            m.key = NULL
            m.key_len = 0
            m.attrs = NULL
            m.payload = <const uint8_t *>PyBytes_AS_STRING(payload)
            m.payload_len = len(<bytes>payload)
            m.record_len = RECORD_FIXED + m.payload_len
        else:
            keep = []
            measure_body(&m, key, attributes, payload, keep)
        self._check_size(&m)
        offset = self.next_off
        self._write(&m, 1, FRAME_HDR + m.record_len)
        if self._should_wake(FRAME_HDR + m.record_len):
            self.wake_cb()
        return offset

    def append_batch(self, messages, publish_time=None):
        """Appends messages (bytes, or (payload, key, attributes, publish_time) tuples with
        trailing items optional, or anything ``normalize`` turns into such a tuple); returns
        the first offset. All or nothing: a bad message appends none of them."""
        # A private copy that owns every message while infos[] holds raw pointers into them:
        # normalize(), a publish_time's __index__ or a Mapping's items() run Python code
        # mid-batch, which may empty the caller's list and free what was already measured.
        cdef list items = list(messages)
        cdef Py_ssize_t n = len(items), i, total = 0, size
        cdef MsgInfo *infos
        cdef MsgInfo *m
        cdef list keep = []
        cdef uint64_t default_time, first
        cdef tuple t
        if n == 0:
            raise ValueError("append_batch needs at least one message")
        default_time = _clock_ms() if publish_time is None else as_u64(publish_time, "publish_time")
        if self.used >= self.pending_bytes_max or (self.shared is not None and (
                self.shared.used >= self.shared.bytes_max
                or (self.shared.waiting > 0 and self.shared.used >= self.shared.resume_bytes))):
            self.wait_for_room_cb()
        infos = <MsgInfo *>malloc(n * sizeof(MsgInfo))
        if infos == NULL:
            raise MemoryError()
        try:
            for i in range(n):
                message = items[i]
                m = &infos[i]
                if type(message) is bytes:
                    m.publish_time = default_time
                    m.key = NULL
                    m.key_len = 0
                    m.attrs = NULL
                    m.payload = <const uint8_t *>PyBytes_AS_STRING(message)
                    m.payload_len = len(<bytes>message)
                    m.record_len = RECORD_FIXED + m.payload_len
                elif type(message) is bytearray or type(message) is memoryview:
                    m.publish_time = default_time
                    measure_body(m, None, None, message, keep)
                else:
                    if type(message) is not tuple:
                        # Rare forms (wal.Message, lists) are turned into the tuple by Python.
                        message = self.normalize_cb(message)
                        keep.append(message)
                        if type(message) is not tuple:
                            raise CodecError("normalize must return a tuple")
                    t = <tuple>message
                    size = len(t)
                    if not 1 <= size <= 4:
                        raise CodecError("each message must be payload or a (payload, key, "
                                         "attributes, publish_time) tuple")
                    if size < 4 or t[3] is None:
                        m.publish_time = default_time
                    else:
                        m.publish_time = as_u64(t[3], "publish_time")
                    measure_body(m, t[1] if size > 1 else None, t[2] if size > 2 else None,
                                  t[0], keep)
                self._check_size(m)
                total += FRAME_HDR + m.record_len
            first = self.next_off
            self._write(infos, n, total)
        finally:
            free(infos)
        if self._should_wake(total):
            self.wake_cb()
        return first

    # -------------------------------------------------------------- the writer's side
    def take(self):
        """Everything pending, in one call: ``(chunks, first_offset, last_offset, nbytes,
        tail_position, tail_count)`` (the fields of ``wal.writer.Batch``, in its order;
        ``nbytes`` is the chunks' total length). ``b"".join(chunks)`` is the frames, back to back; each
        chunk holds whole frames (how they are split is not part of the contract).
        ``tail_position`` is a byte position in that join: from there on lie the newest
        ``tail_count`` frames, the most that fit tail_messages_max and tail_bytes_max
        (``tail_count`` 0 when not even one does). Nothing pending: ``nbytes`` is 0."""
        cdef Py_ssize_t lo, hi, mid, k
        cdef list chunks
        self._enter()
        try:
            self._seal_chunk()
            chunks, self.chunks = self.chunks, []
            # The largest k whose last k frames fit; a frame's start only grows with its
            # index, so the predicate is monotone and a binary search over the ring finds k.
            lo = 0
            hi = self.count if self.count < self.tail_cap else self.tail_cap
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.used - self.ring[(self.count - mid) % self.tail_cap] <= self.tail_bytes_max:
                    lo = mid
                else:
                    hi = mid - 1
            k = lo
            tail_position = self.used if k == 0 else self.ring[(self.count - k) % self.tail_cap]
            result = (chunks, self.first_off, <object>self.next_off - 1, self.used,
                      tail_position, k)
            if self.used:
                # The next round starts with a chunk that would have held this one (under a
                # shared budget, at most SHARED_CHUNK_MAX).
                self.chunk_next = APPEND_CHUNK_MIN
                while (self.chunk_next < self.used and self.chunk_next < APPEND_CHUNK
                       and (self.shared is None or self.chunk_next < SHARED_CHUNK_MAX)):
                    self.chunk_next *= 2
            self.first_off = self.next_off
            self.count = 0
            if self.shared is not None:
                self.shared.used -= self.used
            self.used = 0
        finally:
            self._leave()
        return result

    def leave_shared(self):
        """Stop counting into the shared budget, giving back what is pending (its WAL closed
        or failed: nothing will take it). Idempotent."""
        if self.shared is not None:
            self.shared.used -= self.used
            self.shared = None

    def park(self):
        """Writer, under the WAL lock: mark itself idle iff nothing is pending (atomically
        with appends, so an append either sees ``idle`` and wakes it or was taken first)."""
        if self.count:
            return False
        self.idle = True
        return True

    def unpark(self):
        self.idle = False

    # -------------------------------------------------------------- state
    @property
    def refusal(self):
        """None, or a zero-argument callable returning the exception every append raises."""
        return self.refusal_factory

    @refusal.setter
    def refusal(self, factory):
        if factory is not None and not callable(factory):
            raise TypeError("refusal must be None or a callable returning an exception")
        self.refusal_factory = factory

    @property
    def next_offset(self):
        return self.next_off

    @property
    def pending_first(self):
        return self.first_off

    @property
    def pending_count(self):
        return self.count

    @property
    def pending_bytes(self):
        return self.used

    @property
    def shared_budget(self):
        """The PendingBudget this core counts into, or None."""
        return self.shared

    @property
    def writer_idle(self):
        return self.idle

    @property
    def busy(self):
        return self.in_step
