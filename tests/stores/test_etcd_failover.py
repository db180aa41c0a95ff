"""etcd with several endpoints, and a server that goes away and comes back.

A private ``EtcdServer`` per test (it gets stopped); the dead endpoint is a closed
loopback port listed FIRST, so every call starts on it and must move on by itself.
"""
from __future__ import annotations

import threading
import time

import grpc
import pytest

from tests.fixtures.servers import EtcdServer, free_port
from tiered.errors import StorageUnavailable
from tiered.metadata import Put, absent, value_is
from tiered.metadata.etcd import EtcdMetadataStore, _may_retry_elsewhere

pytestmark = pytest.mark.etcd

CALL_BOUND_S = 1.0  # any single call, up or down, answers within this
RECOVER_BOUND_S = 3.0  # after a restart, the client works again within this


@pytest.fixture
def private_etcd():
    server = EtcdServer().start()
    yield server
    server.cleanup()


def _timed(fn):
    started = time.monotonic()
    try:
        return fn(), None, time.monotonic() - started
    except Exception as e:  # noqa: BLE001 - the caller asserts on the type
        return None, e, time.monotonic() - started


def test_dead_endpoint_listed_first_fails_over_within_a_bound(private_etcd):
    dead = ("127.0.0.1", free_port())  # nothing listens: connection refused
    store = EtcdMetadataStore([dead, private_etcd.endpoint], root="/fo", timeout_s=2, endpoint_retry_s=0.2)
    try:
        started = time.monotonic()
        for i in range(20):
            # Writes first: a refused connection proves the write was never sent.
            rev, err, took = _timed(lambda: store.put(f"/k/{i}", b"v"))
            assert err is None and took < CALL_BOUND_S, (i, err, took)
            assert store.txn([absent(f"/c/{i}")], [Put(f"/c/{i}", b"x")]).succeeded
            assert store.get(f"/k/{i}").value == b"v"
            assert len(store.range("/k/")) == i + 1
            time.sleep(0.01 if i % 5 else 0.25)  # let the dead endpoint's pause lapse now and then
        assert time.monotonic() - started < 10
    finally:
        store.close()


def test_server_stopped_mid_operation_then_restarted_recovers(private_etcd):
    store = EtcdMetadataStore([private_etcd.endpoint], root="/sr", timeout_s=2)
    errors: list[tuple[BaseException, float]] = []
    ok_after_restart = threading.Event()
    restarted = threading.Event()
    stop = threading.Event()
    successes = [0]

    def writer() -> None:
        i = 0
        while not stop.is_set():
            _, err, took = _timed(lambda: store.txn([absent(f"/w/{i}")], [Put(f"/w/{i}", b"x")]))
            if err is None:
                successes[0] += 1
                if restarted.is_set():
                    ok_after_restart.set()
            else:
                errors.append((err, took))
                time.sleep(0.01)
            i += 1

    try:
        store.put("/before", b"kept")
        thread = threading.Thread(target=writer)
        thread.start()
        time.sleep(0.2)
        private_etcd.stop()  # SIGTERM while the writer is mid-stream
        time.sleep(0.5)
        # While down: typed, retryable, immediate.
        _, err, took = _timed(lambda: store.get("/before"))
        assert isinstance(err, StorageUnavailable) and err.retryable and took < CALL_BOUND_S
        private_etcd.start()
        restarted.set()
        assert ok_after_restart.wait(RECOVER_BOUND_S), errors[-3:]
        stop.set()
        thread.join(5)
        assert not thread.is_alive()
        assert successes[0] > 0 and errors, "the writer must have seen the outage"
        assert all(isinstance(e, StorageUnavailable) for e, _ in errors), {type(e) for e, _ in errors}
        assert max(took for _, took in errors) < store.timeout_s + CALL_BOUND_S
        _, err, took = _timed(lambda: store.get("/before"))
        assert err is None and took < CALL_BOUND_S
        assert store.get("/before").value == b"kept"
        # A txn that failed during the outage never landed half-way: each key has version 1.
        assert all(kv.version == 1 for kv in store.range("/w/"))
    finally:
        stop.set()
        store.close()


def test_all_endpoints_down_then_back_recovers_without_waiting_out_the_pause(private_etcd):
    dead = ("127.0.0.1", free_port())
    store = EtcdMetadataStore([dead, private_etcd.endpoint], root="/ad", timeout_s=2, endpoint_retry_s=30)
    try:
        store.put("/k", b"1")
        private_etcd.stop()
        for _ in range(3):
            _, err, took = _timed(lambda: store.put("/k", b"2"))
            assert isinstance(err, StorageUnavailable) and took < CALL_BOUND_S
        private_etcd.start()
        deadline = time.monotonic() + RECOVER_BOUND_S
        while True:  # both endpoints are in a 30 s pause: the client must probe anyway
            _, err, _ = _timed(lambda: store.txn([value_is("/k", b"1")], [Put("/k", b"3")]))
            if err is None:
                break
            assert isinstance(err, StorageUnavailable)
            assert time.monotonic() < deadline, err
            time.sleep(0.05)
        assert store.get("/k").value == b"3"
    finally:
        store.close()


class _FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def test_a_write_is_resent_elsewhere_only_when_it_was_never_sent():
    refused = _FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; Connection refused")
    reset = _FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    deadline = _FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert _may_retry_elsewhere(refused, read_only=False)
    assert not _may_retry_elsewhere(reset, read_only=False)  # may have been applied
    assert _may_retry_elsewhere(reset, read_only=True)
    assert not _may_retry_elsewhere(deadline, read_only=True)
