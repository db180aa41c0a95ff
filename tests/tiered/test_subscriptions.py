"""Subscription cursors: resume, monotonic acks, flush cadence, bad acks, fencing."""
from __future__ import annotations

import time

import pytest

from tests.tiered.helpers_read import TOPIC, Backends, backends, cursor_write_fails_once, wait_until  # noqa: F401 (fixture)
from tiered.metadata import keys
from tiered.metadata.base import value_is
from tiered.read.errors import CursorFenced, InvalidAck, SubscriptionClosed
from tiered.read.subscriptions import SubscriptionManager


class Topic:
    """A stand-in for the topic's bounds (the WAL's first/next offsets)."""

    def __init__(self, first: int = 0, next_offset: int = 28) -> None:
        self.first_offset = first
        self.next_offset = next_offset


def stored(b: Backends, name: str) -> int | None:
    key = keys.cursor_key(TOPIC, name)
    kv = b.metadata.get(key)
    return None if kv is None else keys.Cursor.from_json(key, kv.value).last_acked_offset


def manager(b: Backends, wal=None, **kw) -> SubscriptionManager:
    kw.setdefault("flush_interval_s", 60.0)
    return SubscriptionManager(TOPIC, b.metadata, wal=wal or Topic(), **kw)


def test_resume_at_cursor_plus_one(backends: Backends) -> None:
    with manager(backends) as m:
        sub = m.subscribe("subs_reliable", initial="earliest")
        assert sub.start_offset == 0
        for offset in range(14):
            sub.ack(offset)
        assert sub.flush() is True
    assert stored(backends, "subs_reliable") == 13
    with manager(backends) as m:  # e.g. broker B after a move
        assert m.subscribe("subs_reliable").start_offset == 14


def test_subscribing_again_on_the_same_broker_resumes_after_the_acks(backends: Backends) -> None:
    """The same subscription object comes back; where it starts follows its acks, as a
    subscribe on any other broker would (else a reconnecting consumer reads its acked
    messages again)."""
    with manager(backends) as m:
        sub = m.subscribe("s", initial="earliest")
        for offset in range(10):
            sub.ack(offset)
        again = m.subscribe("s")
        assert again is sub and again.start_offset == 10


def test_new_subscription_latest_pins_its_start(backends: Backends) -> None:
    topic = Topic(first=5, next_offset=22)
    with manager(backends, wal=topic) as m:
        assert m.subscribe("s").start_offset == 22
    assert stored(backends, "s") == 21  # a crash before the first ack must not skip 22..
    topic.next_offset = 30
    with manager(backends, wal=topic) as m:
        assert m.subscribe("s").start_offset == 22
        assert m.subscribe("e", initial="earliest").start_offset == 5


def test_ack_never_moves_backward(backends: Backends) -> None:
    with manager(backends) as m:
        sub = m.subscribe("s", initial="earliest")
        assert sub.ack(10) is True
        assert sub.ack(5) is False
        assert sub.ack(10) is False
        assert sub.cursor == 10
        sub.flush()
        assert stored(backends, "s") == 10
        assert sub.flush() is False  # nothing moved: no write


def test_ack_of_unknown_offset_is_typed(backends: Backends) -> None:
    with manager(backends, wal=Topic(next_offset=28)) as m:
        sub = m.subscribe("s", initial="earliest")
        sub.ack(27)
        with pytest.raises(InvalidAck) as info:
            sub.ack(28)
        assert info.value.offset == 28 and info.value.next_offset == 28
        with pytest.raises(InvalidAck):
            sub.ack(-1)
        assert sub.cursor == 27


def test_flush_every_n_acks_in_background(backends: Backends) -> None:
    with manager(backends, flush_every_acks=5) as m:
        sub = m.subscribe("s", initial="earliest")
        for offset in range(4):
            sub.ack(offset)
        time.sleep(0.2)
        assert stored(backends, "s") == -1  # only the start pin: 4 acks < 5 are not due yet
        sub.ack(4)
        wait_until(lambda: stored(backends, "s") == 4, what="flush after 5 acks")


def test_flush_on_interval_in_background(backends: Backends) -> None:
    with manager(backends, flush_interval_s=0.1) as m:
        sub = m.subscribe("s", initial="earliest")
        sub.ack(3)
        wait_until(lambda: stored(backends, "s") == 3, what="interval flush")


def test_close_flushes_and_refuses_more_acks(backends: Backends) -> None:
    m = manager(backends)
    sub = m.subscribe("s", initial="earliest")
    sub.ack(7)
    m.close()
    assert stored(backends, "s") == 7
    with pytest.raises(SubscriptionClosed):
        sub.ack(8)


@pytest.mark.parametrize("as_callable", [False, True])
def test_fenced_cursor_write_fails(backends: Backends, as_callable: bool) -> None:
    owner = keys.owner_key(TOPIC)
    backends.metadata.put(owner, b"broker-a epoch 1")
    compares = [value_is(owner, b"broker-a epoch 1")]
    fencing = (lambda: compares) if as_callable else compares
    with manager(backends, fencing=fencing) as m:
        sub = m.subscribe("s", initial="earliest")
        sub.ack(5)
        sub.flush()
        backends.metadata.put(owner, b"broker-b epoch 2")  # broker B took over
        sub.ack(9)
        with pytest.raises(CursorFenced):
            sub.flush()
        assert stored(backends, "s") == 5  # the stale owner wrote nothing
        with pytest.raises(CursorFenced):
            sub.ack(10)
        with pytest.raises(CursorFenced):
            m.flush_all()
    assert stored(backends, "s") == 5


def test_bad_subscription_name_is_rejected(backends: Backends) -> None:
    with manager(backends) as m:
        with pytest.raises(ValueError):
            m.subscribe("../x")


def test_concurrent_flushes_never_move_the_stored_cursor_backward(backends: Backends) -> None:
    """The background flusher and flush_all (unload) can flush one subscription at
    once. A flush that read cursor 10 and is slow to write must not land after a
    flush of 20: the store would go back to 10 while the subscription believes 20
    is written (never re-flushed), and the next owner would serve 11..20 again."""
    import threading

    first_write_started, second_write_done = threading.Event(), threading.Event()
    slow = {"armed": False}

    def fencing():
        if slow["armed"]:
            slow["armed"] = False
            first_write_started.set()
            second_write_done.wait(1.0)  # bounded: with the fix the second flush waits for us
        return []

    with manager(backends, fencing=fencing) as m:
        sub = m.subscribe("s", initial="earliest")
        sub.ack(10)
        slow["armed"] = True
        first = threading.Thread(target=sub.flush)
        first.start()
        assert first_write_started.wait(60.0)  # bounds generous for a loaded machine (etcd shares its cores)
        sub.ack(20)
        second = threading.Thread(target=sub.flush)
        second.start()
        second.join(0.5)
        second_write_done.set()
        first.join(60.0)
        second.join(60.0)
        assert not first.is_alive() and not second.is_alive()
        sub.flush()
    assert stored(backends, "s") == 20


def test_an_ack_racing_the_final_flush_of_close_is_refused_not_dropped(backends: Backends) -> None:
    """The interleaving an outside attacker found: an ack passed the
    'closed?' check, then close() flushed, then the ack moved the cursor in memory only;
    the seal released the topic and the next owner redelivered what had been acked. Here
    close() runs exactly in that gap (inside the bounds read the ack makes)."""
    topic = Topic(next_offset=5)
    m = manager(backends, wal=topic)
    sub = m.subscribe("s", initial="earliest")
    sub.ack(3)
    real = m.bounds.next_offset

    def close_in_the_gap() -> int:
        m.close(flush=True)
        return real()

    m.bounds.next_offset = close_in_the_gap
    topic.next_offset = 10
    with pytest.raises(SubscriptionClosed):
        sub.ack(7)  # beyond what the subscription knew: it reads the bounds, close() runs
    assert stored(backends, "s") == 3 == sub.cursor


def test_closing_again_writes_the_acks_a_failed_final_flush_left(backends: Backends, monkeypatch) -> None:
    """A seal's final flush failed once (a metadata timeout); the abandon that follows
    closes the manager again. That close must write the acks still unwritten, not return
    at once because the manager is already stopped (atk30 F1: the restart delivered
    acknowledged messages again)."""
    from tiered.read.errors import CursorWriteFailed

    m = manager(backends)
    sub = m.subscribe("s", initial="earliest")
    sub.ack(4)
    sub.flush()
    sub.ack(14)
    cursor_write_fails_once(monkeypatch)
    with pytest.raises(CursorWriteFailed):
        m.close(flush=True)
    assert m.unwritten_cursors() == {"s": 14}
    m.close(flush=True)
    assert stored(backends, "s") == 14 and m.unwritten_cursors() == {}
    with pytest.raises(SubscriptionClosed):
        sub.ack(20)  # still refused: nothing is acknowledged after the final flush


def test_a_subscribe_racing_close_is_refused_not_left_taking_acks(backends: Backends) -> None:
    """close() runs while subscribe() reads the cursor: the subscription it would return
    was not in the list close() ended, so its acks would never be written (atk30 F2: the
    next owner delivered them again). It is refused instead."""
    m = manager(backends)
    real = m._load

    def close_meanwhile(name, initial):  # type: ignore[no-untyped-def]
        loaded = real(name, initial)
        m.close(flush=True)
        return loaded

    m._load = close_meanwhile  # type: ignore[method-assign]
    with pytest.raises(SubscriptionClosed):
        m.subscribe("s", initial="earliest")
    assert m.subscriptions == {}


def test_the_subscription_bound_is_counted_once_then_followed_in_memory(backends: Backends) -> None:
    """A scan of the stored cursors for every new name let a flood of refused names slow
    every ack of the topic (atk70 F3): one scan per manager, then a count in memory."""
    from tiered.read.errors import TooManySubscriptions

    scans = []
    real_range = backends.metadata.range

    def counting_range(prefix, *args, **kwargs):
        if prefix == keys.subscriptions_prefix(TOPIC):
            scans.append(prefix)
        return real_range(prefix, *args, **kwargs)

    backends.metadata.range = counting_range  # type: ignore[method-assign]
    try:
        m = manager(backends, subscriptions_max=3)
        for name in ("a", "b", "c"):
            m.subscribe(name)
        for name in ("d", "e", "f"):
            with pytest.raises(TooManySubscriptions):
                m.subscribe(name)
        assert m.subscribe("a").name == "a"  # existing ones still work
        assert len(scans) == 1
        m.close()
        again = manager(backends, subscriptions_max=3)  # a new owner counts what is stored
        with pytest.raises(TooManySubscriptions):
            again.subscribe("g")
        again.close()
    finally:
        backends.metadata.range = real_range  # type: ignore[method-assign]
    assert [n for n in ("a", "b", "c", "d", "e", "f", "g") if stored(backends, n) is not None] == ["a", "b", "c"]


def test_unsubscribe_deletes_the_cursor_refuses_the_old_object_and_frees_room(backends: Backends) -> None:
    """A loss path by design: the position is gone and the name starts afresh; the
    object a consumer still holds takes no more acks (they would write it back)."""
    with manager(backends, subscriptions_max=2) as m:
        a = m.subscribe("a", initial="earliest")
        a.ack(7)
        a.flush()
        m.subscribe("b")
        from tiered.read.errors import TooManySubscriptions
        with pytest.raises(TooManySubscriptions):
            m.subscribe("c")
        assert m.unsubscribe("a") is True
        assert stored(backends, "a") is None
        with pytest.raises(SubscriptionClosed):
            a.ack(9)
        with pytest.raises(SubscriptionClosed):
            a.flush()
        assert m.flush_all() == 0 and stored(backends, "a") is None
        m.subscribe("c")  # the room the delete freed
        assert m.unsubscribe("a") is False  # a repeat (after an unknown outcome) answers false
        assert m.unsubscribe("never") is False
        with pytest.raises(ValueError):
            m.unsubscribe("../x")
    with manager(backends) as m:  # another owner: a stored cursor of a name never loaded there
        assert m.unsubscribe("b") is True and stored(backends, "b") is None
        fresh = m.subscribe("a")  # "latest" afresh, not the deleted position
        assert fresh.start_offset == Topic().next_offset


def _blocking_txns(backends: Backends, key: str):
    """Make the next transaction that writes ``key`` wait until released: (entered, release)."""
    import threading
    entered, release = threading.Event(), threading.Event()
    real_txn = backends.metadata.txn

    def txn(compare, success, failure=()):
        if any(getattr(op, "key", None) == key and hasattr(op, "value") for op in success) and not entered.is_set():
            entered.set()
            assert release.wait(30)
        return real_txn(compare, success, failure)
    backends.metadata.txn = txn  # type: ignore[method-assign]
    return entered, release


def test_a_flush_in_flight_ends_before_the_delete_and_none_writes_it_back(backends: Backends) -> None:
    import threading
    key = keys.cursor_key(TOPIC, "s")
    with manager(backends) as m:
        sub = m.subscribe("s", initial="earliest")
        sub.ack(3)
        sub.flush()
        sub.ack(5)
        entered, release = _blocking_txns(backends, key)
        flusher = threading.Thread(target=sub._flush)
        flusher.start()
        assert entered.wait(30)  # the flush's write is in flight
        done = threading.Event()
        unsubscriber = threading.Thread(target=lambda: (m.unsubscribe("s"), done.set()))
        unsubscriber.start()
        assert not done.wait(0.2), "the delete went ahead of the flush in flight"
        release.set()
        flusher.join(30)
        unsubscriber.join(30)
        assert done.is_set()
        m._flush_due()  # the background flusher's turn: nothing of a deleted one is written
        assert m.flush_all() == 0
    assert stored(backends, "s") is None


def test_a_load_of_the_name_waits_for_its_delete(backends: Backends) -> None:
    """A subscribe of a name not in memory must not adopt the record a delete is removing
    (it would resume at the deleted position, and its first flush would write it back)."""
    import threading
    with manager(backends) as m:
        sub = m.subscribe("s", initial="earliest")
        sub.ack(20)
        sub.flush()
    with manager(backends) as m:  # a manager that has not loaded "s"
        real_txn = backends.metadata.txn
        deleting, release = threading.Event(), threading.Event()

        def txn(compare, success, failure=()):
            if any(type(op).__name__ == "Delete" for op in success):
                deleting.set()
                assert release.wait(30)
            return real_txn(compare, success, failure)
        backends.metadata.txn = txn  # type: ignore[method-assign]
        try:
            unsubscriber = threading.Thread(target=m.unsubscribe, args=("s",))
            unsubscriber.start()
            assert deleting.wait(30)
            loaded: list = []
            subscriber = threading.Thread(target=lambda: loaded.append(m.subscribe("s")))
            subscriber.start()
            subscriber.join(0.2)
            assert not loaded, "the load went ahead of the delete"
            release.set()
            unsubscriber.join(30)
            subscriber.join(30)
        finally:
            backends.metadata.txn = real_txn  # type: ignore[method-assign]
        assert loaded[0].start_offset == Topic().next_offset, "it resumed at the deleted position"
    assert stored(backends, "s") == Topic().next_offset - 1  # pinned afresh


def test_a_fenced_unsubscribe_deletes_nothing(backends: Backends) -> None:
    owner = keys.owner_key(TOPIC)
    backends.metadata.put(owner, b"broker-a epoch 1")
    with manager(backends, fencing=[value_is(owner, b"broker-a epoch 1")]) as m:
        m.subscribe("s", initial="earliest").ack(4)
        m.flush_all()
        backends.metadata.put(owner, b"broker-b epoch 2")  # broker B took over
        with pytest.raises(CursorFenced):
            m.unsubscribe("s")
    assert stored(backends, "s") == 4


def _delete_txns(backends: Backends, on_delete):
    """Route every transaction that deletes a key through ``on_delete(real_txn, args)``."""
    real_txn = backends.metadata.txn

    def txn(compare, success, failure=()):
        if any(type(op).__name__ == "Delete" for op in success):
            return on_delete(real_txn, (compare, success, failure))
        return real_txn(compare, success, failure)
    backends.metadata.txn = txn  # type: ignore[method-assign]
    return real_txn


def test_a_delete_applied_late_never_removes_a_cursor_written_after_it(backends: Backends) -> None:
    """atk75 F2: a delete whose answer was lost (a metadata timeout) may still be applied
    later; compared on the revision it read, it then fails instead of removing the cursor a
    consumer acknowledged meanwhile."""
    from tiered.errors import OperationTimeout
    from tiered.read.errors import CursorWriteFailed
    sent = []

    def times_out(real_txn, args):
        sent.append(args)
        raise OperationTimeout("injected: the answer was lost")
    with manager(backends) as m:
        m.subscribe("s", initial="earliest").ack(3)
        m.flush_all()
        real_txn = _delete_txns(backends, times_out)
        with pytest.raises(CursorWriteFailed):
            m.unsubscribe("s")
        backends.metadata.txn = real_txn  # type: ignore[method-assign]
        again = m.subscribe("s")  # the record is still there: the consumer goes on
        assert again.start_offset == 4
        again.ack(9)
        again.flush()
        assert not real_txn(*sent[0]).succeeded  # the lost delete lands now: nothing to do
        assert stored(backends, "s") == 9


def test_a_delete_whose_outcome_was_unknown_leaves_the_bound_counted_again(backends: Backends) -> None:
    """atk75 F3: a delete applied but answered with an error, then repeated (answering
    false), left the count of subscriptions one too high for good."""
    from tiered.errors import OperationTimeout
    from tiered.read.errors import CursorWriteFailed, TooManySubscriptions

    def applies_then_times_out(real_txn, args):
        real_txn(*args)
        raise OperationTimeout("injected: applied, answer lost")
    with manager(backends, subscriptions_max=2) as m:
        m.subscribe("a")
        m.subscribe("b")
        with pytest.raises(TooManySubscriptions):
            m.subscribe("c")
        real_txn = _delete_txns(backends, applies_then_times_out)
        with pytest.raises(CursorWriteFailed):
            m.unsubscribe("a")
        backends.metadata.txn = real_txn  # type: ignore[method-assign]
        assert m.unsubscribe("a") is False and stored(backends, "a") is None
        m.subscribe("c")  # counted again: one stored, room for it


def test_a_delete_forgets_the_names_flush_failure_log(backends: Backends, monkeypatch) -> None:
    """atk75 F4: each name created and deleted left its failure log behind for good."""
    with manager(backends) as m:
        for index in range(20):
            name = f"n{index}"
            m.subscribe(name).ack(index)
            monkeypatch.setattr(m, "_write_cursor", lambda sub, cursor: (_ for _ in ()).throw(OSError("down")))
            m._flush_due()  # fails: logged under the name
            monkeypatch.undo()
            assert m.unsubscribe(name) is True
        assert m._flush_failures == {}


def test_a_slow_load_of_one_name_does_not_hold_up_loads_of_others(backends: Backends) -> None:
    """atk75 F5: one lock per manager made every first load of any name wait for a slow one."""
    import threading
    with manager(backends) as m:
        stripe = m._name_lock("slow")
        other = next(n for n in (f"o{i}" for i in range(1000)) if m._name_lock(n) is not stripe)
        real_get = backends.metadata.get
        entered, release = threading.Event(), threading.Event()

        def get(key):
            if key == keys.cursor_key(TOPIC, "slow"):
                entered.set()
                assert release.wait(30)
            return real_get(key)
        backends.metadata.get = get  # type: ignore[method-assign]
        try:
            slow = threading.Thread(target=m.subscribe, args=("slow",))
            slow.start()
            assert entered.wait(30)
            assert m.subscribe(other).name == other  # not behind the slow one
        finally:
            release.set()
            slow.join(30)
            backends.metadata.get = real_get  # type: ignore[method-assign]


def test_a_delete_racing_close_is_never_taken_for_a_fence(backends: Backends) -> None:
    """atk75 F6: a delete that raced a seal (close, then the owner record released) failed
    its fencing and reported the topic fenced. A delete refused while the manager closes
    is SubscriptionClosed: nothing deleted, no fence reported (close does not wait for it:
    atk76 E1)."""
    import threading
    owner = keys.owner_key(TOPIC)
    backends.metadata.put(owner, b"broker-a epoch 1")
    fenced, outcome = [], []
    entered, release = threading.Event(), threading.Event()

    def waits(real_txn, args):
        entered.set()
        assert release.wait(30)
        return real_txn(*args)
    m = manager(backends, fencing=[value_is(owner, b"broker-a epoch 1")])
    m.on_fenced = lambda: fenced.append(True)
    m.subscribe("s")
    real_txn = _delete_txns(backends, waits)

    def delete() -> None:
        try:
            outcome.append(m.unsubscribe("s"))
        except Exception as e:  # noqa: BLE001 - the outcome is what is checked
            outcome.append(e)
    deleting = threading.Thread(target=delete)
    deleting.start()
    assert entered.wait(30)
    m.close()
    backends.metadata.put(owner, b"released")  # the seal lets go
    release.set()
    deleting.join(30)
    backends.metadata.txn = real_txn  # type: ignore[method-assign]
    assert isinstance(outcome[0], SubscriptionClosed)
    assert not fenced and stored(backends, "s") is not None


def test_a_create_racing_close_is_never_taken_for_a_fence(backends: Backends) -> None:
    """atk76 E6: a consumer's first read creating a name while the topic was sealed failed
    its fencing after the release and reported a fence."""
    owner = keys.owner_key(TOPIC)
    backends.metadata.put(owner, b"broker-a epoch 1")
    fenced: list = []
    m = manager(backends, fencing=[value_is(owner, b"broker-a epoch 1")])
    m.on_fenced = lambda: fenced.append(True)
    real_txn = backends.metadata.txn

    def seal_first(compare, success, failure=()):  # the seal lands just before the create
        m.close()
        backends.metadata.put(owner, b"released")
        return real_txn(compare, success, failure)
    backends.metadata.txn = seal_first  # type: ignore[method-assign]
    try:
        with pytest.raises(SubscriptionClosed):
            m._load("new", "latest")
    finally:
        backends.metadata.txn = real_txn  # type: ignore[method-assign]
    assert not fenced and stored(backends, "new") is None


def test_creates_racing_at_once_never_pass_the_bound(backends: Backends) -> None:
    """atk76 E4: creators racing past the count overshot the bound by as many as ran at
    once; a place is now taken before each create."""
    import threading
    from tiered.read.errors import TooManySubscriptions
    with manager(backends, subscriptions_max=5) as m:
        m.subscribe("first")  # counted
        barrier = threading.Barrier(16)
        results: list = []

        def create(index: int) -> None:
            barrier.wait()
            try:
                results.append(m.subscribe(f"n{index}"))
            except TooManySubscriptions as e:
                results.append(e)
        threads = [threading.Thread(target=create, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    created = len(backends.metadata.range(keys.subscriptions_prefix(TOPIC)))
    assert created == 5 and sum(isinstance(r, TooManySubscriptions) for r in results) == 12


def test_a_create_whose_outcome_was_unknown_is_counted_again(backends: Backends, monkeypatch) -> None:
    """atk76 E2: a create that landed but answered an error was never counted, and its retry
    adopted the record: the bound could be passed without limit."""
    from tiered.errors import OperationTimeout
    from tiered.read.errors import CursorWriteFailed, TooManySubscriptions
    with manager(backends, subscriptions_max=3) as m:
        real_txn = backends.metadata.txn

        def applies_then_times_out(compare, success, failure=()):
            real_txn(compare, success, failure)
            raise OperationTimeout("injected: applied, answer lost")
        for name in ("a", "b", "c", "d"):
            backends.metadata.txn = applies_then_times_out  # type: ignore[method-assign]
            try:
                with pytest.raises((CursorWriteFailed, TooManySubscriptions)):
                    m.subscribe(name)
            finally:
                backends.metadata.txn = real_txn  # type: ignore[method-assign]
        assert len(backends.metadata.range(keys.subscriptions_prefix(TOPIC))) == 3
        with pytest.raises(TooManySubscriptions):
            m.subscribe("e")
