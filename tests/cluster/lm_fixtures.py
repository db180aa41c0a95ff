"""Fixtures of the load-manager runtime tests: a metadata store (SQLite or real etcd)
and an in-process cluster of brokers (host + assignment watcher + load reporter)."""
from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from tiered.cluster import LoadManagerConfig
from tiered.cluster.config import FailoverConfig
from tiered.cluster.reports import LoadReporter
from tiered.cluster.runtime import LoadManager, RuntimeConfig, StepReport
from tiered.lifecycle import BrokerHost
from tiered.lifecycle.watcher import AssignmentWatcher, WatcherConfig
from tiered.metadata import open_metadata
from tests.tiered.helpers_lifecycle import FAST_BROKER, stores_of

#: Event-driven waits are bounded by this; it only matters when something is broken.
WAIT_S = 30.0


def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = WAIT_S, poll_s: float = 0.01):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


@pytest.fixture(params=["sqlite", "etcd"])
def store_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/metadata.db"
    etcd = request.getfixturevalue("etcd_server")
    return f"{etcd.url}/t-{uuid.uuid4().hex[:12]}"


#: Fast settings: decisions are driven by events; intervals only bound idle waits.
FAST_LM = LoadManagerConfig(
    load_report_interval_s=3600.0,
    failover=FailoverConfig(grace_s=0.0, grace_unstable_s=0.0, stable_after_s=0.0),
    assign_timeout_s=60.0,
)
FAST_RUNTIME = RuntimeConfig(leader_ttl_s=2.0, poll_interval_s=0.5, debounce_s=0.01)


class InProcessCluster:
    """Brokers sharing one metadata store (each its own WAL dir), plus load managers."""

    def __init__(self, root: str, metadata, objects) -> None:
        self.root = root
        self.metadata = metadata
        self.objects = objects
        self.hosts: dict[str, BrokerHost] = {}
        self.watchers: dict[str, AssignmentWatcher] = {}
        self.reporters: dict[str, LoadReporter] = {}
        self.managers: list[LoadManager] = []
        #: What ``broker`` starts hosts with (a test stepping by hand sets long leases: a
        #: loaded machine must not let a lease lapse between two of its steps).
        self.broker_config = FAST_BROKER

    def broker(self, broker_id: str) -> BrokerHost:
        host = BrokerHost(broker_id, os.path.join(self.root, f"wal-{broker_id}"), self.metadata, self.objects,
                          self.broker_config)
        self.hosts[broker_id] = host
        self.watchers[broker_id] = AssignmentWatcher(host, WatcherConfig(retry_backoff_s=0.02,
                                                                          retry_backoff_max_s=0.2)).start()
        reporter = LoadReporter(host, interval_s=3600.0)
        reporter.report_once()
        self.reporters[broker_id] = reporter
        return host

    def kill(self, broker_id: str) -> None:
        """A crash: stop following assignments, abandon the topics, drop the lease."""
        self.watchers.pop(broker_id).stop()
        host = self.hosts.pop(broker_id)
        host.close(unload=False)  # revokes the session lease: the registration vanishes

    def manager(self, node_id: str, config: LoadManagerConfig = FAST_LM,
                runtime: RuntimeConfig = FAST_RUNTIME) -> LoadManager:
        lm = LoadManager(self.metadata, node_id, config, runtime)
        self.managers.append(lm)
        return lm

    def report_all(self) -> None:
        for reporter in self.reporters.values():
            reporter.report_once()

    def close(self) -> None:
        for lm in self.managers:
            lm.stop()
        for reporter in self.reporters.values():
            reporter.stop()
        for w in self.watchers.values():
            w.stop()
        for host in self.hosts.values():
            try:
                host.close(unload=False)
            except Exception:  # noqa: BLE001 - teardown closes the rest
                pass


@pytest.fixture(params=["local", "etcd+s3"])
def lm_cluster(request, tmp_path) -> Iterator[InProcessCluster]:
    metadata, objects = stores_of(request, request.param, str(tmp_path))
    cluster = InProcessCluster(str(tmp_path), metadata, objects)
    try:
        yield cluster
    finally:
        cluster.close()
        metadata.close()


class StepLog:
    """Collects step reports of a running manager (``lm.on_step``)."""

    def __init__(self, lm: LoadManager) -> None:
        self.reports: list[StepReport] = []
        self._cond = threading.Condition()
        lm.on_step = self._add

    def _add(self, report: StepReport) -> None:
        with self._cond:
            self.reports.append(report)
            self._cond.notify_all()

    def actions(self) -> list:
        with self._cond:
            return [a for r in self.reports for a in r.applied]


__all__ = ["FAST_LM", "FAST_RUNTIME", "InProcessCluster", "StepLog", "WAIT_S", "lm_cluster", "open_metadata",
           "replace", "store_url", "wait_for"]
