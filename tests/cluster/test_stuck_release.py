"""A load-manager move whose seal fails for longer than the watcher's bounded attempts
(the object store down during the upload drain) must still finish once the store is
back (finding F4): the source's watcher keeps retrying the unload while the topic is
unassigned there, instead of giving up and leaving the placement ``releasing`` and the
topic refusing writes until someone restarts the broker.

Safety checked along the way: the target is never assigned before the source's seal
landed (replayed from revision 1), one assignment key per topic at every revision,
every acknowledged offset read back exactly once with its payload, contiguous, and
``verify`` OK. Waits are on stored state with generous bounds, never sleeps."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest

from tiered.cluster import admin
from tiered.lifecycle import BrokerHost
from tiered.lifecycle.ownership import OwnerRecord
from tiered.lifecycle.watcher import AssignmentWatcher, WatcherConfig
from tiered.cluster.reports import LoadReporter
from tiered.metadata import keys
from tiered.metadata.base import DeleteEvent
from tiered.objects.testing.faults import FaultyObjectStore
from tiered.tools.verify import verify_topic
from tests.cluster.lm_fixtures import FAST_LM, InProcessCluster, wait_for
from tests.cluster.test_runtime import all_owned, assert_one_assignment_per_topic, host_of, placements
from tests.tiered.helpers_lifecycle import FAST_BROKER, FAST_UPLOADER, read_all, stores_of

TOPIC = "/default/stuck-release"
#: A short drain and few attempts: the watcher's bounded attempts run out quickly.
BROKER = replace(FAST_BROKER, uploader=replace(FAST_UPLOADER, drain_timeout_s=0.3))
WATCHER = WatcherConfig(retry_attempts_max=2, retry_backoff_s=0.01, retry_backoff_max_s=0.05,
                        unload_retry_max_s=0.2)


class FaultyCluster(InProcessCluster):
    """Brokers whose watchers give up their bounded attempts quickly."""

    def broker(self, broker_id: str) -> BrokerHost:
        host = BrokerHost(broker_id, os.path.join(self.root, f"wal-{broker_id}"), self.metadata, self.objects,
                          BROKER)
        self.hosts[broker_id] = host
        self.watchers[broker_id] = AssignmentWatcher(host, WATCHER).start()
        reporter = LoadReporter(host, interval_s=3600.0)
        reporter.report_once()
        self.reporters[broker_id] = reporter
        return host


@pytest.fixture(params=["local", "etcd+s3"])
def faulty_cluster(request, tmp_path):
    metadata, objects = stores_of(request, request.param, str(tmp_path))
    cluster = FaultyCluster(str(tmp_path), metadata, FaultyObjectStore(objects))
    try:
        yield cluster
    finally:
        cluster.objects.faults.clear()
        cluster.close()
        metadata.close()


def assert_target_assigned_only_after_the_seal(cluster: InProcessCluster, topic: str, source: str,
                                               target: str) -> None:
    """Replays every revision: when the target's assignment key is put, the owner record
    in force is released by the source and the state record is sealed."""
    metadata = cluster.metadata
    end = metadata.put("/test/replay-end", b"")
    owner = state = None
    assignment = keys.assignment_key(target, topic)
    watch = metadata.watch_prefix("/", start_revision=1)
    seen_assignment = False
    try:
        while True:
            event = watch.get(timeout_s=5.0)
            assert event is not None, "the replay ended before the current revision"
            if event.key == keys.owner_key(topic) and not isinstance(event, DeleteEvent):
                owner = OwnerRecord.decode(event.key, event.value)
            elif event.key == keys.state_key(topic) and not isinstance(event, DeleteEvent):
                state = keys.SealedState.from_json(event.key, event.value)
            elif event.key == assignment and not isinstance(event, DeleteEvent) and not seen_assignment:
                seen_assignment = True
                assert owner is not None and owner.broker_id == source and owner.holder is None, owner
                assert state is not None and state.sealed and state.broker_id == source, state
            if event.key == "/test/replay-end" and event.revision == end:
                break
    finally:
        watch.cancel()
    assert seen_assignment, f"{target} was never assigned {topic}"


def test_a_move_whose_seal_fails_past_the_watchers_attempts_finishes_once_the_store_is_back(faulty_cluster):
    cluster = faulty_cluster
    faults = cluster.objects.faults
    for b in ("1", "2"):
        cluster.broker(b)
    lm = cluster.manager("lm-a", FAST_LM).start()
    wait_for(lm.election.is_leader, "a leader")
    admin.request_topic(cluster.metadata, TOPIC, to_broker="1")
    wait_for(lambda: all_owned(cluster, [TOPIC], {"1"}), "placed on 1")

    faults.fail("put")  # the object store is down from here: nothing more gets archived
    source = host_of(cluster, TOPIC)
    acked = [source.produce(f"{TOPIC}:{i}".encode()) for i in range(10)]  # durable acks only
    admin.request_move(cluster.metadata, TOPIC, "2")
    # The source's watcher runs out of its bounded attempts (the drain cannot upload).
    wait_for(lambda: cluster.watchers["1"].errors, "the source's unload to fail past its bounded attempts")
    [(failed_topic, action, _error)] = cluster.watchers["1"].errors
    assert (str(failed_topic), action) == (TOPIC, "unload")
    p = placements(cluster)[TOPIC]
    assert (p.state, p.broker, p.target) == ("releasing", "1", "2")
    assert cluster.metadata.get(keys.assignment_key("2", TOPIC)) is None  # never before the seal

    faults.clear()  # the store is back: the move must finish without anyone restarting broker 1
    wait_for(lambda: all_owned(cluster, [TOPIC], {"2"}), "the move to finish on 2")
    wait_for(lambda: not cluster.watchers["1"].unload_retrying(), "the source's unload retries to end")
    assert TOPIC not in {str(h.topic) for h in cluster.hosts["1"].topics()}

    target = host_of(cluster, TOPIC)
    acked += [target.produce(f"{TOPIC}:{i}".encode()) for i in range(10, 13)]
    messages = read_all(target, 0, len(acked) - 1)
    assert [m.offset for m in messages] == acked == list(range(13))  # contiguous, each once
    assert [m.payload for m in messages] == [f"{TOPIC}:{i}".encode() for i in range(13)]
    report = verify_topic(TOPIC, cluster.metadata, cluster.objects, check_objects=True)
    assert report.ok, report.problems
    assert_target_assigned_only_after_the_seal(cluster, TOPIC, "1", "2")
    assert_one_assignment_per_topic(cluster)
