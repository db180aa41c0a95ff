"""A broker that restarts (same id, same disk) after the leader's failover ``Reassign``
landed but before the target loaded the topic still holds it: the target's load is
refused (``TopicOwnedElsewhere``: the holder is live) and the holder, with no
assignment, never loads or seals it. The leader gives the topic back to the holder,
which recovers its own WAL: every acked offset is served once, offsets continue, and
nothing is recorded lost (attack finding F5).

Deterministic: the leader is stepped by hand (never started), the targets' watchers are
stopped for the window (as a target busy loading the rest of a failover would be), and
they give up on the refused load after a bounded number of attempts; load reports are
written by hand. Nothing depends on how fast the machine is."""
from __future__ import annotations

from tiered.cluster import admin, records
from tiered.cluster.runtime import LoadManager
from tiered.lifecycle.ownership import TopicOwnedElsewhere
from tiered.lifecycle.watcher import AssignmentWatcher, WatcherConfig
from tiered.metadata import keys
from tiered.tools.verify import verify_topic
from tests.cluster.lm_fixtures import (  # noqa: F401 - lm_cluster is a fixture
    FAST_LM, FAST_RUNTIME, InProcessCluster, lm_cluster, replace, wait_for)
from tests.cluster.test_runtime import all_owned, assert_one_assignment_per_topic, placements
from tests.tiered.helpers_lifecycle import read_all

TOPIC = "/default/f5"


def step(lm: LoadManager):
    lm.election.tick()
    return lm.step()


def step_until(lm: LoadManager, predicate, what: str):
    return wait_for(lambda: (step(lm), predicate())[1], what)


def failover_decided_then_holder_restarts(cluster: InProcessCluster) -> tuple[LoadManager, str, list[int]]:
    """Broker 1 holds TOPIC with 4 durable acks; it crashes, the leader fails the topic
    over to 2 or 3 (whose watchers are stopped), 1 restarts with its disk, and the
    target then tries the load and gives up (refused: 1 is live and holds the topic).
    Returns the manager (stepped by hand), the target and the acked offsets."""
    # Leases far longer than the test: a broker's crash revokes its lease (``kill``), and
    # no lease may lapse between two hand-made steps on a loaded machine.
    cluster.broker_config = replace(cluster.broker_config, session_ttl_s=120.0)
    for b in ("1", "2", "3"):
        cluster.broker(b)
    lm = cluster.manager("lm-a", FAST_LM, replace(FAST_RUNTIME, leader_ttl_s=120.0))  # grace 0: failover due at once
    wait_for(lambda: (lm.election.tick(), lm.election.is_leader())[1], "leadership")
    admin.request_topic(cluster.metadata, TOPIC, to_broker="1")
    step_until(lm, lambda: all_owned(cluster, [TOPIC], {"1"}), "placed on 1")
    acked = [cluster.hosts["1"].topic(TOPIC).produce(f"{TOPIC}:{i}".encode()) for i in range(4)]
    for b in ("2", "3"):  # the targets are busy: they do not react in the window
        cluster.watchers.pop(b).stop()
    cluster.kill("1")
    cluster.reporters.pop("1")
    step_until(lm, lambda: placements(cluster)[TOPIC].broker != "1", "the failover's Reassign")
    p = placements(cluster)[TOPIC]
    assert p.state == "assigning" and p.kind == "failover" and p.broker in ("2", "3")
    target = p.broker
    cluster.broker("1")  # the restart: same id, same WAL directory, nothing assigned to it
    for b in ("2", "3"):
        cluster.watchers[b] = AssignmentWatcher(cluster.hosts[b], WatcherConfig(
            retry_attempts_max=2, retry_backoff_s=0.01, retry_backoff_max_s=0.02)).start()
    wait_for(lambda: any(isinstance(e, TopicOwnedElsewhere) for _, _, e in cluster.watchers[target].errors),
             "the target's load refused: the restarted holder is live")
    assert not cluster.hosts["1"].topics() and cluster.metadata.get(keys.assignment_key("1", TOPIC)) is None
    return lm, target, acked


def check_served_by_the_holder(cluster: InProcessCluster, lm: LoadManager, acked: list[int]) -> None:
    step_until(lm, lambda: all_owned(cluster, [TOPIC], {"1"}), "broker 1 hosting its topic again")
    hosted = cluster.hosts["1"].topic(TOPIC)
    for i in range(4, 6):
        acked.append(hosted.produce(f"{TOPIC}:{i}".encode()))
    messages = read_all(hosted, 0, len(acked) - 1)
    assert [m.offset for m in messages] == acked == list(range(6))  # each acked offset once, contiguous
    assert [m.payload for m in messages] == [f"{TOPIC}:{i}".encode() for i in range(6)]
    report = verify_topic(TOPIC, cluster.metadata, cluster.objects)
    assert report.ok, report.problems
    assert not keys.read_lost_ranges(cluster.metadata, TOPIC)  # 1 recovered its own WAL: nothing lost
    [h] = admin.history(cluster.metadata)["history"]
    assert h["kind"] == "failover" and h["to_broker"] == "1" and h["completed_at"] is not None
    assert "given back" in h["reason"]
    assert_one_assignment_per_topic(cluster)


def test_a_holder_restarting_after_its_failover_was_decided_gets_its_topic_back(lm_cluster):
    cluster = lm_cluster
    lm, target, acked = failover_decided_then_holder_restarts(cluster)
    step(lm)  # 1 registered after the Reassign: it cannot be sealing the topic
    p = placements(cluster)[TOPIC]
    assert (p.state, p.broker, p.reason) == ("assigning", "1", "given back")
    assert cluster.metadata.get(keys.assignment_key(target, TOPIC)) is None  # one assignment per topic
    check_served_by_the_holder(cluster, lm, acked)


def test_the_holder_gets_it_back_only_once_its_report_shows_it_is_not_sealing_it(lm_cluster):
    """The placement changed after the holder registered (e.g. a retarget): only a load
    report of the holder written since, and not listing the topic, proves it is not
    hosting (or sealing) it; a report listing it leaves the placement alone."""
    cluster = lm_cluster
    lm, target, acked = failover_decided_then_holder_restarts(cluster)
    key = records.placement_key(TOPIC)
    cluster.metadata.put(key, cluster.metadata.get(key).value)  # a later revision than 1's registration
    sealing = cluster.reporters["1"].build()
    sealing = replace(sealing, topics=[{"topic": TOPIC, "epoch": 1}])
    cluster.metadata.put(records.load_key("1"), records.encode(sealing))
    step(lm)
    p = placements(cluster)[TOPIC]
    assert (p.state, p.broker) == ("assigning", target)  # 1 could still be sealing: left alone
    assert cluster.metadata.get(keys.assignment_key("1", TOPIC)) is None
    assert cluster.reporters["1"].report_once()  # the real report: 1 hosts nothing
    step(lm)
    p = placements(cluster)[TOPIC]
    assert (p.state, p.broker, p.reason) == ("assigning", "1", "given back")
    check_served_by_the_holder(cluster, lm, acked)
