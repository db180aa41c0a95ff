"""The load manager's loops and the broker's lease keep-alive log like every retry loop
(tiered/logs.py): the first failure with its cause, repeats rate-limited, one recovery
line. Event-driven: each test waits for counted attempts, never for time to pass."""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from tests.cluster.lm_fixtures import FAST_LM, FAST_RUNTIME, wait_for
from tests.tiered.helpers_lifecycle import FAST_BROKER
from tiered.cluster.leader import LeaderElection
from tiered.cluster.reports import LoadReporter
from tiered.cluster.runtime import LoadManager
from tiered.lifecycle import BrokerHost
from tiered.lifecycle.ownership import BrokerSession
from tiered.metadata import open_metadata
from tiered.metadata.testing.faults import FaultPlan, FaultyMetadataStore
from tiered.objects import open_objects

ATTEMPTS = 5


def _lines(caplog, what: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(what)]


def _assert_one_failure_then_one_recovery(caplog, what: str, level: int = logging.WARNING) -> None:
    lines = _lines(caplog, what)
    assert len(lines) == 2, [r.getMessage() for r in lines]
    failure, recovery = lines
    assert failure.levelno == level and "injected" in failure.getMessage()  # the cause is named
    assert recovery.levelno == level and "recovered after" in recovery.getMessage()


def _faulty(tmp_path) -> tuple[FaultyMetadataStore, FaultPlan]:
    plan = FaultPlan()
    return FaultyMetadataStore(open_metadata(f"sqlite:///{tmp_path}/metadata.db"), plan), plan


def test_leader_lease_refresh_failures(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="tiered")
    store, plan = _faulty(tmp_path)
    election = LeaderElection(store, "A", ttl_s=600.0)  # the lease outlives the test: no step-down
    election.tick()
    assert election.is_leader()
    plan.fail("refresh_lease")
    for _ in range(ATTEMPTS):
        election.tick()
    assert election.refresh_failures == ATTEMPTS and election.is_leader()
    plan.clear()
    election.tick()
    _assert_one_failure_then_one_recovery(caplog, "load manager A: leader lease refresh")
    election.resign()
    store.close()


def test_election_steps_that_cannot_reach_the_store(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="tiered")
    store, plan = _faulty(tmp_path)
    plan.fail("grant_lease")
    election = LeaderElection(store, "A", ttl_s=0.3).start()  # campaigns every ttl_s / 3
    try:
        wait_for(lambda: plan.calls["grant_lease"] >= ATTEMPTS, "failing campaigns")
        plan.clear()
        wait_for(election.is_leader, "leadership once the store is back")
    finally:
        election.stop()
    _assert_one_failure_then_one_recovery(caplog, "load manager A: election step")
    store.close()


def test_load_manager_steps(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="tiered")
    store, plan = _faulty(tmp_path)
    manager = LoadManager(store, "lm", FAST_LM, FAST_RUNTIME)
    steps: list[object] = []
    manager.on_step = steps.append
    manager.start()
    try:
        wait_for(lambda: manager.election.is_leader() and steps, "a leader's first step")
        plan.fail("range")  # the snapshot read of every step
        failing_from = plan.calls["range"]
        wait_for(lambda: plan.calls["range"] >= failing_from + ATTEMPTS, "failing steps")
        plan.clear()
        wait_for(lambda: _lines(caplog, "load manager lm: step recovered"), "the recovery line")
    finally:
        manager.stop()
    _assert_one_failure_then_one_recovery(caplog, "load manager lm: step")
    store.close()


def test_load_reports(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="tiered")
    store, plan = _faulty(tmp_path)
    host = BrokerHost("A", str(tmp_path / "wal"), store, open_objects(f"file://{tmp_path}/objects"), FAST_BROKER,
                      metrics_registry=CollectorRegistry())
    try:
        reporter = LoadReporter(host, interval_s=3600.0)
        assert reporter.report_once()
        plan.fail("put")
        assert not any(reporter.report_once() for _ in range(ATTEMPTS))
        plan.clear()
        assert reporter.report_once()
    finally:
        host.close(unload=False)
    _assert_one_failure_then_one_recovery(caplog, "broker A: load report", level=logging.INFO)
    store.close()


def test_lease_keep_alive(tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="tiered")
    store, plan = _faulty(tmp_path)
    session = BrokerSession(store, "A", ttl_s=1.5).start()  # refreshes every 0.5 s
    try:
        plan.fail("refresh_lease")
        wait_for(lambda: session.keepalive_failures >= 3, "failing keep-alives")
        plan.clear()
        wait_for(lambda: session.keepalive_failures == 0, "a keep-alive that works again")
    finally:
        session.stop()
    _assert_one_failure_then_one_recovery(caplog, "broker A: lease keep-alive")
    store.close()
