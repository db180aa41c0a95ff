"""The metadata-store contract: every backend binds this once (see test_metadata_*.py).

A binding provides two fixtures: ``store_url`` (a URL ``open_metadata`` accepts, unique
per test, openable from another process) and ``store`` (an open store on that URL).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tiered.errors import CompactedRevision, LeaseNotFound, StorageError
from tiered.metadata import (
    Compare,
    Delete,
    DeleteEvent,
    Get,
    MetadataStore,
    Put,
    PutEvent,
    absent,
    mod_revision_is,
    open_metadata,
    value_is,
    version_is,
)

EVENT_WAIT_S = 3.0


def _events(watch, count: int, timeout_s: float = EVENT_WAIT_S) -> list:
    deadline = time.monotonic() + timeout_s
    out = []
    while len(out) < count and time.monotonic() < deadline:
        event = watch.get(timeout_s=max(0.0, deadline - time.monotonic()))
        if event is not None:
            out.append(event)
    return out


def _race_in_child(args: tuple[str, list[str], str]) -> list[str]:
    """Runs in a spawned process: a fresh client, one create-if-absent per key."""
    url, keys, me = args
    store = open_metadata(url)
    try:
        return [k for k in keys if store.txn([absent(k)], [Put(k, me.encode())]).succeeded]
    finally:
        store.close()


class MetadataContract:
    @pytest.fixture
    def store_url(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def private_store_url(self, store_url: str) -> str:
        """A store whose compaction no other test sees. On etcd compaction is server-wide,
        and other tests replay a shared server's history from revision 1."""
        return store_url

    @pytest.fixture
    def store(self, store_url: str):
        s = open_metadata(store_url)
        yield s
        s.close()

    # -- basic key/value ---------------------------------------------------
    def test_put_get_delete_and_revisions(self, store: MetadataStore) -> None:
        assert store.get("/k") is None
        r1 = store.put("/k", b"v1")
        r2 = store.put("/k", b"v2")
        assert r2 > r1
        kv = store.get("/k")
        assert (kv.value, kv.version, kv.create_revision, kv.mod_revision) == (b"v2", 2, r1, r2)
        assert store.current_revision() == r2
        assert store.delete("/k") is True
        assert store.delete("/k") is False
        assert store.get("/k") is None

    def test_range_is_ordered_limited_and_prefix_exact(self, store: MetadataStore) -> None:
        for key in ["/p/b", "/p/a", "/p/c/d", "/pa", "/p0", "/q"]:
            store.put(key, key.encode())
        assert [kv.key for kv in store.range("/p/")] == ["/p/a", "/p/b", "/p/c/d"]
        assert [kv.key for kv in store.range("/p/", limit=2)] == ["/p/a", "/p/b"]
        assert [kv.key for kv in store.range("/p/", limit=2, start_after="/p/b")] == ["/p/c/d"]
        assert store.range("/none/") == []

    def test_delete_prefix(self, store: MetadataStore) -> None:
        for key in ["/d/1", "/d/2", "/dx"]:
            store.put(key, b"x")
        assert store.delete_prefix("/d/") == 2
        assert [kv.key for kv in store.range("/d")] == ["/dx"]

    # -- transactions ------------------------------------------------------
    def test_create_if_absent(self, store: MetadataStore) -> None:
        first = store.txn([absent("/c")], [Put("/c", b"one")], [Get("/c")])
        second = store.txn([absent("/c")], [Put("/c", b"two")], [Get("/c")])
        assert first.succeeded and first.responses == [None]
        assert not second.succeeded and second.responses[0].value == b"one"
        assert second.revision == first.revision  # a failed txn writes nothing

    def test_value_compare_and_swap(self, store: MetadataStore) -> None:
        assert not store.txn([value_is("/v", b"x")], [Put("/v", b"y")]).succeeded  # absent: false
        store.put("/v", b"x")
        assert store.txn([value_is("/v", b"x")], [Put("/v", b"y")]).succeeded
        assert not store.txn([value_is("/v", b"x")], [Put("/v", b"z")]).succeeded
        assert store.get("/v").value == b"y"
        assert store.txn([Compare("/v", "value", "!=", b"x")], []).succeeded

    def test_mod_revision_and_version_compares(self, store: MetadataStore) -> None:
        store.put("/m", b"1")
        kv = store.get("/m")
        store.put("/m", b"2")
        assert not store.txn([mod_revision_is("/m", kv.mod_revision)], [Put("/m", b"3")]).succeeded
        now = store.get("/m")
        assert store.txn([mod_revision_is("/m", now.mod_revision), version_is("/m", 2)], [Put("/m", b"3")]).succeeded
        assert store.txn([Compare("/m", "version", ">", 2)], []).succeeded
        assert store.txn([Compare("/m", "mod_revision", "<", 10**9)], []).succeeded

    def test_multi_key_txn_is_atomic(self, store: MetadataStore) -> None:
        store.put("/t/old", b"x")
        result = store.txn(
            [absent("/t/a"), value_is("/t/old", b"x")],
            [Put("/t/a", b"1"), Put("/t/b", b"2"), Delete("/t/old"), Get("/t/a")],
        )
        assert result.succeeded
        assert result.responses[2] is True and result.responses[3].value == b"1"
        kvs = store.range("/t/")
        assert [(kv.key, kv.value) for kv in kvs] == [("/t/a", b"1"), ("/t/b", b"2")]
        assert {kv.mod_revision for kv in kvs} == {result.revision}  # one revision per txn
        failed = store.txn([absent("/t/a")], [Put("/t/c", b"3")], [Put("/t/d", b"4")])
        assert not failed.succeeded and store.get("/t/c") is None and store.get("/t/d").value == b"4"

    def test_key_written_twice_in_one_txn_is_rejected(self, store: MetadataStore) -> None:
        with pytest.raises(ValueError):
            store.txn([], [Put("/dup", b"1"), Put("/dup", b"2")])

    # -- watches -----------------------------------------------------------
    def test_watch_put_and_delete_events(self, store: MetadataStore) -> None:
        with store.watch_prefix("/w/") as watch:
            store.put("/w/a", b"1")
            store.put("/other", b"x")
            store.delete("/w/a")
            events = _events(watch, 2)
        assert isinstance(events[0], PutEvent) and (events[0].key, events[0].value) == ("/w/a", b"1")
        assert isinstance(events[1], DeleteEvent) and events[1].key == "/w/a"
        assert events[1].revision > events[0].revision

    def test_watch_resumes_from_revision(self, store: MetadataStore) -> None:
        revs = [store.put(f"/r/{i}", str(i).encode()) for i in range(5)]
        with store.watch_prefix("/r/", start_revision=revs[2]) as watch:
            events = _events(watch, 3)
            assert [e.key for e in events] == ["/r/2", "/r/3", "/r/4"]
            assert watch.next_revision == revs[4] + 1
            assert watch.get(timeout_s=0.1) is None  # nothing more

    def test_watch_cancel_from_another_thread_is_prompt(self, store: MetadataStore) -> None:
        watch = store.watch_prefix("/c/")
        seen: list = []
        consumer = threading.Thread(target=lambda: seen.extend(watch))
        consumer.start()
        time.sleep(0.1)
        started = time.monotonic()
        watch.cancel()
        consumer.join(timeout=2.0)
        assert not consumer.is_alive()
        assert time.monotonic() - started < 0.5
        assert seen == []

    def test_watch_from_compacted_revision_is_a_typed_error(self, private_store_url: str) -> None:
        with contextlib.closing(open_metadata(private_store_url)) as store:
            self._watch_from_compacted(store)

    def _watch_from_compacted(self, store: MetadataStore) -> None:
        first = store.put("/z/a", b"1")
        store.put("/z/a", b"2")
        last = store.put("/z/a", b"3")
        store.compact(last)
        with pytest.raises(CompactedRevision):
            watch = store.watch_prefix("/z/", start_revision=first)
            _events(watch, 1, timeout_s=2.0)
        with store.watch_prefix("/z/", start_revision=last) as watch:  # recover from there
            assert _events(watch, 1)[0].value == b"3"

    # -- snapshots ---------------------------------------------------------
    def test_snapshot_reads_see_one_revision(self, store: MetadataStore, store_url: str) -> None:
        before = store.put("/s/mode", b"drained")
        other = open_metadata(store_url)  # another client, as an operator's CLI would be
        try:
            with store.snapshot() as view:
                assert view.revision == before
                assert [kv.value for kv in view.range("/s/")] == [b"drained"]
                other.put("/s/mode", b"active")
                other.put("/s/request", b"on the now active broker")
                # The two writes made in order are invisible together: no mix of moments.
                assert view.get("/s/request") is None
                assert view.get("/s/mode").value == b"drained"  # type: ignore[union-attr]
                assert [kv.key for kv in view.range("/s/")] == ["/s/mode"]
            assert [kv.value for kv in store.range("/s/")] == [b"active", b"on the now active broker"]
        finally:
            other.close()

    def test_snapshot_compacted_meanwhile_is_retryable_or_still_exact(self, private_store_url: str) -> None:
        store = open_metadata(private_store_url)
        store.put("/s/a", b"1")
        other = open_metadata(private_store_url)
        try:
            with store.snapshot() as view:
                last = other.put("/s/a", b"2")
                other.compact(last)
                try:
                    seen = view.get("/s/a")
                except StorageError as e:  # the revision is gone: read a new snapshot
                    assert e.retryable
                else:
                    assert seen is not None and seen.value == b"1"
        finally:
            other.close()
            store.close()

    # -- leases ------------------------------------------------------------
    def test_lease_expiry_deletes_keys_with_an_event(self, store: MetadataStore) -> None:
        lease = store.grant_lease(1)
        store.put("/l/a", b"x", lease_id=lease.id)
        assert store.get("/l/a").lease_id == lease.id
        with store.watch_prefix("/l/") as watch:
            events = _events(watch, 1, timeout_s=6.0)
        assert events and isinstance(events[0], DeleteEvent)
        assert store.get("/l/a") is None
        with pytest.raises(LeaseNotFound):
            store.refresh_lease(lease.id)

    def test_lease_refresh_and_revoke(self, store: MetadataStore) -> None:
        lease = store.grant_lease(1)
        store.put("/lr/a", b"x", lease_id=lease.id)
        for _ in range(3):
            time.sleep(0.5)
            store.refresh_lease(lease.id)
        assert store.get("/lr/a") is not None  # 1.5 s > TTL, kept alive
        store.revoke_lease(lease.id)
        assert store.get("/lr/a") is None

    def test_put_with_unknown_lease_fails(self, store: MetadataStore) -> None:
        with pytest.raises(LeaseNotFound):
            store.put("/lx", b"x", lease_id=0x7FFF_0000_1234)

    # -- concurrency -------------------------------------------------------
    def test_racing_threads_have_one_winner_per_key(self, store: MetadataStore) -> None:
        keys = [f"/race/{i}" for i in range(40)]

        def contender(me: int) -> list[str]:
            return [k for k in keys if store.txn([absent(k)], [Put(k, str(me).encode())]).succeeded]

        with ThreadPoolExecutor(6) as pool:
            wins = [k for result in pool.map(contender, range(6)) for k in result]
        assert sorted(wins) == sorted(keys)

    def test_racing_processes_have_one_winner_per_key(self, store: MetadataStore, store_url: str) -> None:
        keys = [f"/prace/{i}" for i in range(40)]
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(3) as pool:
            results = pool.map_async(_race_in_child, [(store_url, keys, f"p{i}") for i in range(3)]).get(timeout=60)
        wins = [k for result in results for k in result]
        assert sorted(wins) == sorted(keys)
        winners = {kv.key: kv.value for kv in store.range("/prace/")}
        assert len(winners) == 40 and all(kv.version == 1 for kv in store.range("/prace/"))
