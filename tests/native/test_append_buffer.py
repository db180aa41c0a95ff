"""The WAL append core (``AppendBuffer``) over both twins: same bytes, same errors, callbacks
only on the rare paths, atomic offset allocation under many threads."""
from __future__ import annotations

import threading
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import native
from native.errors import CodecError


class TooLarge(ValueError):
    pass


class Calls:
    """Records every callback the core makes."""

    def __init__(self) -> None:
        self.wakes = 0
        self.room_waits = 0
        self.normalized: list = []

    def wake(self) -> None:
        self.wakes += 1

    def wait_for_room(self) -> None:
        self.room_waits += 1

    def normalize(self, message) -> tuple:
        self.normalized.append(message)
        return tuple(message)


def make(codec, next_offset=0, calls=None, **overrides):
    calls = calls or Calls()
    options = dict(max_message_bytes=1000, pending_bytes_max=1 << 20, batch_bytes=1 << 16,
                   tail_messages_max=4, tail_bytes_max=200, wake=calls.wake,
                   wait_for_room=calls.wait_for_room, too_large=TooLarge,
                   normalize=calls.normalize)
    options.update(overrides)
    return codec.AppendBuffer(next_offset, **options), calls


def feed(core) -> None:
    """Every accepted form, with explicit publish times so the bytes are deterministic."""
    core.append(b"one", publish_time=1)
    core.append(b"two", key=b"k", attributes={"a": "b", "\u00e9": "\u20ac"}, publish_time=2)
    core.append(bytearray(b"three"), key=memoryview(b""), publish_time=3)
    core.append_batch([b"b1", (b"b2",), (b"b3", b"key"), (b"b4", None, {"x": "y"}),
                       (b"b5", None, None, 55), [b"b6", b"list"], memoryview(b"b7")],
                      publish_time=4)
    for i in range(20):  # wraps the tail ring several times
        core.append(b"p%d" % i * (i % 5 + 1), publish_time=100 + i)


def expected_frames(first: int) -> bytes:
    """The same messages through the plain codec (the format's reference encoder)."""
    py = native.available_codecs()[0]
    msgs = [(1, None, None, b"one"), (2, b"k", {"a": "b", "\u00e9": "\u20ac"}, b"two"),
            (3, b"", None, b"three"), (4, None, None, b"b1"), (4, None, None, b"b2"),
            (4, b"key", None, b"b3"), (4, None, {"x": "y"}, b"b4"), (55, None, None, b"b5"),
            (4, b"list", None, b"b6"), (4, None, None, b"b7")]
    msgs += [(100 + i, None, None, b"p%d" % i * (i % 5 + 1)) for i in range(20)]
    return py.encode_batch(first, msgs)


def test_twins_take_identical_bytes_and_tails(codec):
    core, calls = make(codec, next_offset=7)
    feed(core)
    chunks, first, last, nbytes, tail_position, tail_count = core.take()
    data = b"".join(chunks)
    assert data == expected_frames(7) and nbytes == len(data)
    assert (first, last) == (7, 36) and core.next_offset == 37
    assert core.pending_count == 0 and core.pending_bytes == 0 and core.pending_first == 37
    # The tail is the newest frames within 4 messages and 200 bytes.
    scan = codec.scan_frames(data, expected_offset=7, positions=True)
    assert scan.error is None and scan.count == 30
    assert tail_position == scan.positions[30 - tail_count]
    assert 1 <= tail_count <= 4 and len(data) - tail_position <= 200
    assert tail_count == 4 or len(data) - scan.positions[30 - tail_count - 1] > 200
    assert calls.normalized == [[b"b6", b"list"]]
    assert calls.wakes == 0 and calls.room_waits == 0


def test_both_twins_agree_exactly():
    twins = native.available_codecs()
    if len(twins) < 2:
        pytest.skip("only one twin available")
    results = []
    for twin in twins:
        core, _ = make(twin, next_offset=2**40)
        feed(core)
        first = joined(core.take())
        core.append(b"x" * 150, publish_time=9)
        core.append(b"y" * 150, publish_time=9)
        results.append((first, joined(core.take())))
    assert results[0] == results[1]
    assert results[0][1][4:] == (results[0][1][0].index(b"y" * 150) - 26, 1), "only one fits 200 B"


def joined(taken: tuple) -> tuple:
    """take() with its chunks joined: how frames are split into chunks may differ by twin."""
    chunks, *rest = taken
    assert all(chunks), "no empty chunks"
    return (b"".join(chunks), *rest)


def test_tail_count_zero_when_last_frame_exceeds_the_byte_bound(codec):
    core, _ = make(codec, tail_bytes_max=50)
    core.append(b"z" * 100, publish_time=1)
    chunks, first, last, nbytes, tail_position, tail_count = core.take()
    data = b"".join(chunks)
    assert (last - first + 1, nbytes, tail_position, tail_count) == (1, len(data), len(data), 0)


def test_default_publish_time_is_the_wall_clock_in_ms(codec):
    core, _ = make(codec)
    before = time.time_ns() // 1_000_000
    core.append(b"a")
    core.append_batch([b"b", (b"c", None, None, None)])
    after = time.time_ns() // 1_000_000
    scan = codec.scan_frames(b"".join(core.take()[0]), expected_offset=0)
    assert all(before <= r.publish_time <= after for r in scan.records)


def test_refused_and_oversized_messages_use_no_offset(codec):
    core, _ = make(codec, next_offset=5, max_message_bytes=100)
    with pytest.raises(TooLarge, match="record of 101 bytes exceeds max_message_bytes 100"):
        core.append(b"x" * 91)
    with pytest.raises(TooLarge):
        core.append(b"x" * 80, key=b"k" * 20)
    with pytest.raises(TooLarge):
        core.append_batch([b"ok", b"x" * 91])
    with pytest.raises(CodecError):
        core.append_batch([b"ok", (b"a", None, None, None, "extra")])
    with pytest.raises(CodecError):
        core.append_batch([b"ok", (None,)])
    with pytest.raises(CodecError):
        core.append(b"ok", attributes={"a": 1})
    with pytest.raises(ValueError, match="at least one"):
        core.append_batch([])
    assert core.next_offset == 5 and core.pending_count == 0, "nothing may be half-appended"
    assert core.append(b"x" * 90) == 5

    core.refusal = lambda: RuntimeError("closed")
    errors = []
    for _ in range(2):
        with pytest.raises(RuntimeError, match="closed") as info:
            core.append(b"late")
        errors.append(info.value)
    with pytest.raises(RuntimeError):
        core.append_batch([b"late"])
    assert errors[0] is not errors[1], "each refusal is a fresh exception (no growing traceback)"
    assert core.next_offset == 6
    with pytest.raises(TypeError):
        core.refusal = RuntimeError("not a factory")


def test_wake_only_when_parked_or_the_batch_threshold_is_crossed(codec):
    seen_busy = []
    calls = Calls()

    def wake() -> None:
        seen_busy.append(core.busy)  # callbacks run outside the atomic step
        calls.wake()

    core, _ = make(codec, calls=calls, batch_bytes=300, wake=wake)
    core.append(b"a" * 50, publish_time=1)  # 76 B
    assert calls.wakes == 0
    core.append_batch([b"a" * 50] * 3, publish_time=1)  # 304 B: crosses 300 once
    assert calls.wakes == 1
    core.append(b"a" * 50, publish_time=1)
    assert calls.wakes == 1, "past the threshold, appends do not call back again"
    assert core.park() is False, "cannot park with frames pending"
    core.take()
    assert core.park() is True and core.writer_idle
    core.append(b"b", publish_time=1)
    assert calls.wakes == 2 and not core.writer_idle
    core.append(b"c", publish_time=1)
    assert calls.wakes == 2
    assert seen_busy == [False, False] and core.busy is False


def test_backpressure_calls_wait_for_room_before_appending(codec):
    calls = Calls()
    core, _ = make(codec, calls=calls, max_message_bytes=100, pending_bytes_max=200)
    core.append(b"x" * 80, publish_time=1)  # 106 B
    assert calls.room_waits == 0
    core.append(b"x" * 80, publish_time=1)  # 212 B now
    assert calls.room_waits == 0
    core.append(b"x", publish_time=1)
    core.append_batch([b"x"], publish_time=1)
    assert calls.room_waits == 2
    core.take()
    core.append(b"x", publish_time=1)
    assert calls.room_waits == 2


def test_a_shared_budget_counts_every_core_and_backpressures_all_of_them(codec):
    """Cores sharing a PendingBudget count into it exactly what they hold pending; an
    append to any of them finds it full and calls wait_for_room first, although its own
    core is far from its own bound; take() and leave_shared() give their bytes back."""
    budget = codec.PendingBudget(300)
    calls = [Calls(), Calls()]
    cores = [make(codec, calls=c, max_message_bytes=100, pending_bytes_max=1 << 20, shared=budget)[0]
             for c in calls]
    assert budget.used == 0 and not budget.full and cores[0].shared_budget is budget
    cores[0].append(b"x" * 80, publish_time=1)
    cores[1].append_batch([b"x" * 80, b"y"], publish_time=1)
    assert budget.used == cores[0].pending_bytes + cores[1].pending_bytes > 200
    assert [c.room_waits for c in calls] == [0, 0]
    cores[0].append(b"x" * 80, publish_time=1)  # passes 300: the check comes before the append
    assert budget.full
    cores[1].append(b"z", publish_time=1)
    cores[1].append_batch([b"z"], publish_time=1)
    assert [c.room_waits for c in calls] == [0, 2], "core 1 is far below its own bound"
    taken = cores[0].take()[3]
    assert budget.used == cores[1].pending_bytes and taken > 0
    cores[1].leave_shared()
    cores[1].leave_shared()  # idempotent
    assert budget.used == 0 and cores[1].shared_budget is None
    cores[1].append(b"w", publish_time=1)
    cores[1].take()
    assert budget.used == 0, "a core that left counts nothing more"


def test_while_appends_wait_for_a_nearly_full_budget_every_append_queues_behind_them(codec):
    """No barging (atk83 F3): with appends waiting and the budget nearly full (at least
    ``resume_bytes``, seven eighths), an append to any core calls wait_for_room first (where
    it queues behind them), although there is room. Below that there is room for all: it
    goes straight in, so the line empties (atk85 F2: a line that every append joined never
    emptied under steady load, and appends ran 17 times slower)."""
    budget = codec.PendingBudget(1000)
    assert budget.resume_bytes == 875
    calls = Calls()
    core, _ = make(codec, calls=calls, max_message_bytes=1000, shared=budget)
    core.append(b"x" * 400, publish_time=1)
    budget.waiting = 1
    assert not budget.must_wait and budget.used < 875
    core.append(b"x", publish_time=1)
    assert calls.room_waits == 0, "room for all: no need to queue"
    core.append(b"x" * 450, publish_time=1)
    assert budget.used >= 875 and not budget.full and budget.must_wait
    core.append(b"x", publish_time=1)
    core.append_batch([b"x"], publish_time=1)
    assert calls.room_waits == 2
    budget.waiting = 0
    assert not budget.must_wait
    core.append(b"x", publish_time=1)
    assert calls.room_waits == 2


def _compiled():
    """The compiled twin (chunks are its alone: the Python twin keeps pieces); the suite's
    guard (tests/conftest.py) makes sure it loaded."""
    return next(t for t in native.available_codecs() if t.IMPLEMENTATION == "cython")


def test_under_a_shared_budget_a_round_after_a_big_one_starts_with_a_small_chunk():
    """The budget counts frames, not the chunks they sit in: after a big round, one small
    pending message must not hold a 1 MiB chunk (atk85 F1)."""
    codec = _compiled()
    tracemalloc.start()
    try:
        core, _ = make(codec, max_message_bytes=100_000, shared=codec.PendingBudget(1 << 30))
        core.append_batch([b"x" * 90_000] * 8, publish_time=1)  # a round of 720 KB
        core.take()
        before = tracemalloc.get_traced_memory()[0]
        core.append(b"small", publish_time=1)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown <= 64 * 1024 + 4096, grown


@pytest.mark.parametrize("sizes", [[60_000, 10], [60_000, 120_000, 250_000, 500_000, 10], [3_000] * 200])
def test_under_a_shared_budget_a_core_holds_at_most_64_kib_beyond_its_frames(sizes):
    """Whatever the appends, what the chunks hold beyond the pending frames (which the
    budget counts) stays under 64 KiB (atk86 F1: chunks that doubled up to 1 MiB held up
    to 3 times what was counted)."""
    codec = _compiled()
    tracemalloc.start()
    try:
        core, _ = make(codec, max_message_bytes=1 << 20, shared=codec.PendingBudget(1 << 30))
        before = tracemalloc.get_traced_memory()[0]
        for size in sizes:
            core.append(b"x" * size, publish_time=1)
        held = tracemalloc.get_traced_memory()[0] - before
        pending = core.pending_bytes
    finally:
        tracemalloc.stop()
    assert held - pending <= 64 * 1024 + 8192, (held, pending)


def test_a_shared_budget_of_the_other_twin_is_refused():
    twins = native.available_codecs()
    if len(twins) < 2:
        pytest.skip("only one twin here")
    python, compiled = twins[0], twins[1]
    for core_twin, budget_twin in ((python, compiled), (compiled, python)):
        with pytest.raises(TypeError):
            make(core_twin, shared=budget_twin.PendingBudget(100))
    for twin in twins:
        with pytest.raises(ValueError):
            twin.PendingBudget(0)


def test_twins_count_a_shared_budget_identically():
    used = []
    for twin in native.available_codecs():
        budget = twin.PendingBudget(1 << 20)
        core, _ = make(twin, shared=budget)
        feed(core)
        seen = [budget.used]
        core.take()
        seen.append(budget.used)
        core.append(b"again", publish_time=7)
        seen.append(budget.used)
        used.append(seen)
    assert all(seen == used[0] for seen in used) and used[0][0] > 0 and used[0][1] == 0


def test_many_threads_get_unique_contiguous_offsets_in_buffer_order(codec):
    core, _ = make(codec, pending_bytes_max=1 << 30, tail_messages_max=1024, tail_bytes_max=1 << 20)
    threads_n, per_thread = 4, 2000
    taken: list = []
    stop = threading.Event()

    def produce(thread_id: int) -> None:
        for i in range(per_thread):
            if i % 7 == 0:
                core.append_batch([b"%d:%d:b" % (thread_id, i)] * 3, publish_time=1)
            else:
                core.append(b"%d:%d" % (thread_id, i), publish_time=1)

    def drain() -> None:
        while not stop.is_set():
            taken.append(core.take())
            time.sleep(0.0005)

    drainer = threading.Thread(target=drain)
    producers = [threading.Thread(target=produce, args=(t,)) for t in range(threads_n)]
    drainer.start()
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join(60)
    stop.set()
    drainer.join(60)
    taken.append(core.take())
    expected_first = 0
    payloads = []
    for chunks, first, last, nbytes, _pos, _k in taken:
        count = last - first + 1
        assert first == expected_first and nbytes == sum(map(len, chunks))
        scan = codec.scan_frames(b"".join(chunks), expected_offset=first)
        assert scan.error is None and scan.count == count
        payloads += [r.payload for r in scan.records]
        expected_first = last + 1
    per_thread_total = per_thread + 2 * ((per_thread + 6) // 7)
    assert expected_first == core.next_offset == threads_n * per_thread_total
    last_seen = {}
    for payload in payloads:  # each thread's messages appear in the order it appended them
        thread_id, i = map(int, payload.split(b":")[:2])
        assert i >= last_seen.get(thread_id, -1)
        last_seen[thread_id] = i


def test_a_dict_grown_between_measuring_and_writing_never_corrupts_the_buffer(codec):
    attributes = {"a": "b"}

    class Sneaky:
        pass

    def normalize(message) -> tuple:
        attributes.update({f"k{i}": "v" * 50 for i in range(5)})  # Python code mid-batch
        return (b"later",)

    core, _ = make(codec, normalize=normalize)
    core.append(b"before", publish_time=1)
    try:
        core.append_batch([(b"first", None, attributes), Sneaky()], publish_time=1)
    except AssertionError:
        assert core.next_offset == 1, "a refused batch must leave nothing behind"
    chunks, first, last, nbytes, _pos, _k = core.take()
    scan = codec.scan_frames(b"".join(chunks), expected_offset=0)
    assert scan.error is None and scan.count == last - first + 1 == core.next_offset
    assert nbytes == sum(map(len, chunks))
    assert core.busy is False


def test_chunks_hold_whole_frames_across_chunk_boundaries(codec):
    """Enough data for several 1 MiB chunks, and a batch bigger than one chunk."""
    core, _ = make(codec, max_message_bytes=100_000, pending_bytes_max=1 << 30,
                   tail_messages_max=1000, tail_bytes_max=300_000)
    for i in range(300):
        core.append(bytes([i % 256]) * (i * 97 % 9000 + 1), publish_time=1)
    core.append_batch([b"B" * 90_000] * 15, publish_time=2)  # 1.35 MB in one batch
    core.append(b"end", publish_time=3)
    chunks, first, last, nbytes, tail_position, tail_count = core.take()
    assert all(chunks) and (first, last, nbytes) == (0, 315, sum(map(len, chunks)))
    start = 0
    for chunk in chunks:  # each chunk scans on its own: no frame is split
        scan = codec.scan_frames(chunk, expected_offset=start)
        assert scan.error is None and scan.end == len(chunk)
        start += scan.count
    assert start == 316
    data = b"".join(chunks)
    scan = codec.scan_frames(data, expected_offset=0, positions=True)
    assert tail_position == scan.positions[316 - tail_count] and tail_count == 4
    assert core.take()[0] == [] and core.append(b"again", publish_time=1) == 316


def _fresh(n: int, fill: int) -> bytes:
    """A bytes object referenced only by whoever holds the result (not interned, not shared)."""
    return bytes([fill]) * n


def test_batch_elements_dropped_by_a_callback_mid_batch_are_still_encoded_intact(codec):
    """Python code runs mid-batch (normalize, a publish_time's __index__). If it drops the
    caller's list items, the core must not read payloads, keys or attribute dicts it had
    measured from freed memory: that would store garbage under a valid CRC."""
    messages: list = []

    def normalize(message) -> tuple:
        messages.clear()  # frees the earlier tuples and their only references to the payloads
        junk = [_fresh(300, 0x5A) for _ in range(2000)]  # reuse the freed memory
        del junk
        return (b"last",)

    class Later:
        pass

    core, _ = make(codec, normalize=normalize)
    messages.extend([(_fresh(300, 0x41), _fresh(40, 0x4B), {"n" * 3: "v" * 20}), _fresh(300, 0x42),
                     Later()])
    assert core.append_batch(messages, publish_time=7) == 0
    data = b"".join(core.take()[0])
    scan = codec.scan_frames(data, expected_offset=0)
    assert scan.error is None and scan.count == 3
    assert scan.records[0].payload == b"A" * 300 and scan.records[0].key == b"K" * 40
    assert scan.records[0].attributes == {"nnn": "v" * 20}
    assert scan.records[1].payload == b"B" * 300 and scan.records[2].payload == b"last"


def test_encode_batch_survives_a_publish_time_index_that_drops_earlier_messages(codec):
    messages: list = []

    class When:
        def __index__(self) -> int:
            messages.clear()
            junk = [_fresh(300, 0x5A) for _ in range(2000)]
            del junk
            return 9

    messages.extend([(1, _fresh(40, 0x4B), None, _fresh(300, 0x41)), (When(), None, None, b"x")])
    data = codec.encode_batch(0, messages)
    scan = codec.scan_frames(data, expected_offset=0)
    assert scan.error is None and scan.count == 2
    assert scan.records[0].payload == b"A" * 300 and scan.records[0].key == b"K" * 40


def _payload(size: int, seed: int) -> bytes:
    return bytes([seed % 251]) * size


def _run_rounds(twin, rounds: list) -> list[tuple]:
    """Feeds ``rounds`` (each a list of single sizes or lists of sizes for one batch), takes
    after each round and returns what each take() gave, chunks joined; every chunk must hold
    whole frames on its own."""
    core, _ = make(twin, next_offset=11, max_message_bytes=300_000, pending_bytes_max=1 << 30,
                   tail_messages_max=50, tail_bytes_max=400_000)
    taken = []
    seed = 0
    for round_ in rounds:
        for item in round_:
            seed += 1
            if isinstance(item, list):
                core.append_batch([_payload(size, seed + i) for i, size in enumerate(item)],
                                  publish_time=seed)
            else:
                core.append(_payload(item, seed), publish_time=seed)
        chunks, first, *rest = core.take()
        assert all(chunks), "no empty chunks"
        expected = first
        for chunk in chunks:  # how frames are split is free, but never inside a frame
            scan = twin.scan_frames(chunk, expected_offset=expected, decode=False)
            assert scan.error is None and scan.end == len(chunk)
            expected += scan.count
        taken.append((b"".join(chunks), first, *rest))
    return taken


# Idle rounds of one small message, a round that needs chunks of every size, a batch larger
# than the largest chunk, an idle round right after a busy one, an empty take.
ROUND_SHAPES = [
    [[100], [100], [3]],
    [[1000] * 3000],
    [[7]],
    [[5000, [250_000] * 6, 10, [4000] * 3]],
    [[], [1], [[1, 2, 3]], [1023, [1024, 1023, 1025]]],
    [[200_000] * 8, [60] * 40],
]


@pytest.mark.parametrize("rounds", ROUND_SHAPES, ids=range(len(ROUND_SHAPES)))
def test_twins_take_identical_bytes_whatever_the_chunk_sizes(rounds):
    results = [_run_rounds(twin, rounds) for twin in native.available_codecs()]
    assert all(result == results[0] for result in results)


_sizes = st.sampled_from([1, 90, 1023, 1024, 4000, 4100, 9000, 70_000, 140_000, 300_000 - 26])
_items = st.one_of(_sizes, st.lists(_sizes, min_size=1, max_size=8))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(_items, max_size=6), min_size=1, max_size=5))
def test_twins_take_identical_bytes_for_any_rounds(rounds):
    results = [_run_rounds(twin, rounds) for twin in native.available_codecs()]
    assert all(result == results[0] for result in results)


def test_an_idle_round_allocates_kilobytes_not_a_whole_chunk(codec):
    """A topic that gets one small message per commit round must not allocate a 1 MiB chunk
    per round (1,000 idle topics would cost 1,000 of them per round)."""
    core, _ = make(codec, max_message_bytes=100_000, pending_bytes_max=1 << 30,
                   tail_messages_max=1000, tail_bytes_max=1 << 20)
    core.append_batch([b"x" * 90_000] * 30, publish_time=1)  # a busy round: 2.7 MB
    core.take()
    core.append(b"s" * 100, publish_time=1)  # the round after a busy one may start big
    core.take()
    tracemalloc.start()
    try:
        for _ in range(3):
            tracemalloc.reset_peak()
            core.append(b"s" * 100, publish_time=1)
            chunks = core.take()[0]
            assert tracemalloc.get_traced_memory()[1] < 16 * 1024
            assert len(b"".join(chunks)) == 16 + 10 + 100
    finally:
        tracemalloc.stop()


def test_a_small_round_reuses_the_chunk_of_the_round_before():
    """A topic taking one small message per round writes it into the chunk its last round
    left (emptied), not into a fresh 4 KiB one: freeing 1,000 of them per round let glibc
    give the heap's top back to the kernel, and every append of the next round faulted a
    page in again (4 us per append at 1,000 topics instead of 0.35)."""
    codec = _compiled()
    core, _ = make(codec)
    core.append(b"m" * 100, publish_time=1)
    core.take()
    tracemalloc.start()
    try:
        for _ in range(3):
            start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            core.append(b"m" * 100, publish_time=1)
            chunks = core.take()[0]
            assert tracemalloc.get_traced_memory()[1] - start < 2048
            assert len(chunks) == 1 and len(chunks[0]) == 16 + 10 + 100
    finally:
        tracemalloc.stop()


def test_frames_taken_stay_intact_while_their_chunk_is_reused(codec):
    """What take() handed out is never written again, also when the chunk it came from is
    reused for the next rounds: every round kept, then checked against a fresh encoding."""
    core, _ = make(codec, max_message_bytes=5000, pending_bytes_max=1 << 20)
    taken = []
    sizes = [100, 3, 1500, 100, 2500, 40, 100, 4000, 7, 100] * 3
    for round_, size in enumerate(sizes):
        core.append(_payload(size, round_), publish_time=round_)
        if round_ % 3 == 2:
            core.append_batch([_payload(size // 2 + 1, round_ + 1000)] * 2, publish_time=round_)
        taken.append(core.take())
    reference, _ = make(codec, max_message_bytes=5000, pending_bytes_max=1 << 20)  # joined at once
    for round_, size in enumerate(sizes):
        reference.append(_payload(size, round_), publish_time=round_)
        if round_ % 3 == 2:
            reference.append_batch([_payload(size // 2 + 1, round_ + 1000)] * 2, publish_time=round_)
        chunks, *fields = taken[round_]
        expected, *expected_fields = reference.take()
        assert b"".join(chunks) == b"".join(expected) and fields == expected_fields, round_


@pytest.mark.parametrize("batch", [False, True])
def test_a_payload_is_copied_once_on_its_way_through_the_core(codec, batch):
    """Appending and taking a large payload allocates about one copy of it (the pending
    frames), not one per encoding step."""
    core, _ = make(codec, max_message_bytes=3_000_000, pending_bytes_max=1 << 30)
    payloads = [_payload(1_000_000, 1), _payload(1_000_000, 2)]
    tracemalloc.start()
    try:
        if batch:
            core.append_batch(payloads, publish_time=1)
        else:
            for payload in payloads:
                core.append(payload, publish_time=1)
        chunks = core.take()[0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(map(len, chunks)) == 2 * (16 + 10 + 1_000_000)
    assert peak < 1.3 * 2_000_000, f"{peak} bytes allocated for 2 MB of payload"


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def test_small_rounds_kept_by_the_cache_cost_their_size_not_a_chunk_each(codec) -> None:
    """What a topic with one small message per commit round hands the cache must not pin a
    whole allocation chunk (4 KiB) per message. The compiled core shrank the chunk in place,
    and the freed rest of each block could never hold the next chunk: 1,000 topics at
    20,000 msg/s grew the heap by 80 MB/s. Here: 40,000 rounds of one 100 B message, every
    take kept (as the cache keeps them), over two topics whose rounds interleave as in a
    commit group; a chunk each grows it by about 80 MB."""
    cores = [make(codec)[0], make(codec)[0]]
    kept = []
    before = _rss_kib()
    for _ in range(20_000):
        for core in cores:
            core.append(b"m" * 100, publish_time=1)
        for core in cores:
            kept.append(core.take()[0])
    grown_mib = (_rss_kib() - before) / 1024
    assert all(len(chunks) == 1 and len(chunks[0]) < 200 for chunks in kept)
    # Kept: 40,000 lists, bytes and tuples of about 300 B in all, ~12 MiB.
    assert grown_mib < 40, f"the heap grew {grown_mib:.0f} MiB for 5 MB of frames"
