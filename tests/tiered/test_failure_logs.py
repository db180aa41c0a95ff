"""Retry loops log state transitions once and rate-limit repeats; an ``archived`` produce
that times out because uploads fail says why (the last upload error is its cause)."""
from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import CollectorRegistry

from tests.tiered.helpers_lifecycle import FAST_BROKER, TOPIC, local_stores
from tiered.errors import StorageUnavailable
from tiered.lifecycle import BrokerHost, ProduceTimeout
from tiered.logs import FailureLog, describe
from tiered.metadata.testing.faults import FaultPlan, FaultyMetadataStore
from tiered.objects.testing.faults import FaultyObjectStore


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_repeated_failures_give_one_line_then_one_per_interval_and_a_recovery_line(caplog) -> None:
    logger = logging.getLogger("test.failure_log")
    clock = _Clock()
    failures = FailureLog(logger, "topic /ns/t: upload", interval_s=30.0, clock=clock)
    caplog.set_level(logging.INFO, logger=logger.name)
    for _ in range(113):  # a 12 s outage retried every ~0.1 s
        clock.now += 0.1
        failures.failed(StorageUnavailable("etcd unreachable"))
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "etcd unreachable" in caplog.records[0].getMessage()

    clock.now += 30.0
    failures.failed(StorageUnavailable("etcd unreachable"))
    assert len(caplog.records) == 2
    assert "112 similar suppressed" in caplog.records[1].getMessage()

    failures.succeeded()
    failures.succeeded()  # once per transition
    assert len(caplog.records) == 3
    recovery = caplog.records[2]
    assert recovery.levelno == logging.WARNING and "recovered after 114 failure(s)" in recovery.getMessage()

    failures.failed(StorageUnavailable("again"))  # a new outage is a new transition
    assert len(caplog.records) == 4 and "again" in caplog.records[3].getMessage()


def test_describe_names_the_cause_chain() -> None:
    try:
        try:
            raise ConnectionRefusedError("connect refused")
        except OSError as e:
            raise StorageUnavailable("etcd unavailable") from e
    except StorageUnavailable as e:
        text = describe(e)
    assert text == "StorageUnavailable: etcd unavailable <- caused by ConnectionRefusedError: connect refused"


#: A bound on waits for events that happen in milliseconds on an idle machine; passing
#: tests never wait it out, so it can be generous for a loaded CI machine.
WAIT_S = 60.0


def _wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def faulty_host(tmp_path):
    metadata, objects = local_stores(str(tmp_path))
    plan = FaultPlan()
    host = BrokerHost("A", str(tmp_path / "wal-A"), FaultyMetadataStore(metadata, plan),
                      FaultyObjectStore(objects, plan), FAST_BROKER, metrics_registry=CollectorRegistry())
    yield host, plan
    plan.clear()
    host.close(unload=False)
    metadata.close()


@pytest.mark.parametrize("op", ["put", "txn"], ids=["bucket-unavailable", "metadata-unavailable"])
def test_archived_produce_timeout_is_caused_by_the_last_upload_error(faulty_host, op, caplog) -> None:
    host, plan = faulty_host
    hosted = host.load(TOPIC)
    hosted.produce(b"before", ack="archived", timeout_s=WAIT_S)
    plan.fail(op)  # every later call fails: the bucket or the metadata store is gone
    caplog.set_level(logging.INFO, logger="uploader")
    # Event-driven, not timed: let one upload attempt fail before the short produce
    # timeouts below, which then must carry that failure as their cause.
    hosted.produce(b"first", ack="durable", timeout_s=WAIT_S)
    hosted.uploader.request_upload()
    _wait_until(lambda: hosted.uploader.last_error is not None)
    for _ in range(3):
        with pytest.raises(ProduceTimeout) as raised:
            hosted.produce(b"during", ack="archived", timeout_s=0.5)
        assert isinstance(raised.value.__cause__, StorageUnavailable)
        assert "last upload error: StorageUnavailable: injected" in str(raised.value)
    assert hosted.uploader.last_error is raised.value.__cause__
    assert hosted.uploader.failed is None  # not fatal: archiving resumes once the store is back
    failing = [r for r in caplog.records if r.levelno >= logging.WARNING and "upload" in r.getMessage()]
    assert 1 <= len(failing) <= 2, [r.getMessage() for r in failing]

    plan.clear()
    hosted.produce(b"after", ack="archived", timeout_s=WAIT_S)
    _wait_until(lambda: hosted.uploader.last_error is None)  # the archiving pass ends just after the ack
    assert [r for r in caplog.records if "recovered after" in r.getMessage()]


def test_a_pass_that_leaves_a_small_object_for_later_does_not_say_the_store_is_back(faulty_host, caplog) -> None:
    host, plan = faulty_host
    hosted = host.load(TOPIC)
    hosted.produce(b"before", ack="archived", timeout_s=WAIT_S)
    plan.fail("put")
    caplog.set_level(logging.INFO, logger="uploader")
    hosted.produce(b"first", ack="durable", timeout_s=WAIT_S)
    hosted.uploader.request_upload()
    _wait_until(lambda: hosted.uploader.last_error is not None)
    error = hosted.uploader.last_error
    # A background pass that finds the next object not full (nor old) never calls the
    # store: it is no evidence that the store is back.
    hosted.uploader._pass_with_retries(time.monotonic() + WAIT_S, retention=False, force=False)
    assert hosted.uploader.last_error is error
    assert not [r for r in caplog.records if "recovered after" in r.getMessage()]


def test_a_host_starting_while_its_store_is_briefly_unavailable_registers_once_it_answers(tmp_path) -> None:
    """Nothing is written before the session lease exists, so a store that does not answer
    for a moment (an election, an overloaded server) is retried, for up to one TTL; past
    that, or for an error that is not retryable, the start fails."""
    from tiered.errors import StorageUnavailable

    from dataclasses import replace

    metadata, objects = local_stores(str(tmp_path))
    plan = FaultPlan()
    plan.fail("grant_lease", error=StorageUnavailable, times=2)
    # A TTL far longer than two short back-offs, however loaded the machine.
    config = replace(FAST_BROKER, session_ttl_s=120.0)
    host = BrokerHost("A", str(tmp_path / "wal-A"), FaultyMetadataStore(metadata, plan), objects, config,
                      metrics_registry=CollectorRegistry())
    try:
        assert plan.calls["grant_lease"] == 3 and host.session is not None and host.session.lease_id
    finally:
        host.close(unload=False)
    plan.fail("grant_lease", error=ValueError)  # not a store being briefly away: no retry
    with pytest.raises(ValueError):
        BrokerHost("B", str(tmp_path / "wal-B"), FaultyMetadataStore(metadata, plan), objects, FAST_BROKER,
                   metrics_registry=CollectorRegistry())
    assert plan.calls["grant_lease"] == 4
    metadata.close()
