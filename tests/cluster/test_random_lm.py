"""Randomized scenarios of the load-manager runtime on in-process brokers: seeded
schedules of drains, undrains, operator moves, new topics, broker crashes with a
same-id restart (within the failover grace), and leader crashes (no resignation: the
lease must lapse), with messages produced after every step. At the end every acked
offset is read back exactly once with its payload, offsets are contiguous, ``verify``
is OK, and no revision ever had two assignment keys for one topic.

``DNB_LM_SEEDS=N`` runs N seeds per store instead of the default few."""
from __future__ import annotations

import os
import random

import pytest

from tiered.cluster import admin
from tiered.cluster.config import FailoverConfig
from tiered.cluster.observe import read_snapshot
from tiered.cluster.runtime import RuntimeConfig
from tests.cluster.lm_fixtures import FAST_LM, InProcessCluster, lm_cluster, replace, wait_for  # noqa: F401
from tests.cluster.test_runtime import all_owned, assert_one_assignment_per_topic, host_of
from tests.tiered.helpers_lifecycle import read_all
from tiered.verify import verify_topic

SEEDS = int(os.environ.get("DNB_LM_SEEDS", "3"))
STEPS = 8
BROKERS = ("1", "2", "3", "4")
CONFIG = replace(FAST_LM, failover=FailoverConfig(grace_s=3600.0, grace_unstable_s=3600.0), drain_parallel=2)
RUNTIME = RuntimeConfig(leader_ttl_s=1.0, poll_interval_s=0.3, debounce_s=0.01)
KINDS = (("drain", 3), ("undrain", 2), ("move", 4), ("new_topic", 2), ("restart", 2), ("leader_crash", 2))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_load_manager_scenario(lm_cluster, seed):
    cluster: InProcessCluster = lm_cluster
    rng = random.Random(f"lm-{seed}")
    for b in BROKERS:
        cluster.broker(b)
    managers = [cluster.manager(f"lm-{i}", CONFIG, RUNTIME).start() for i in range(2)]
    topics = [f"/default/r{seed}-{i}" for i in range(3)]
    for t in topics:
        admin.request_topic(cluster.metadata, t)
    acked: dict[str, list[int]] = {}
    modes = {b: "active" for b in BROKERS}
    log: list[str] = []

    def active() -> set[str]:
        return {b for b, m in modes.items() if m == "active"}

    def settle(what: str) -> None:
        wait_for(lambda: all_owned(cluster, topics, active()), f"{what} (seed {seed}, steps {log})")
        if any(m == "draining" for m in modes.values()):
            wait_for(lambda: all(read_snapshot(cluster.metadata).modes[b][0].mode == "drained"
                                 for b, m in modes.items() if m == "draining"), f"drained (seed {seed})")
            for b, m in modes.items():
                if m == "draining":
                    modes[b] = "drained"

    def produce() -> None:
        for t in topics:
            hosted = host_of(cluster, t)
            for _ in range(rng.randint(1, 3)):
                offsets = acked.setdefault(t, [])
                offsets.append(hosted.produce(f"{t}:{len(offsets)}".encode()))

    settle("initial placement")
    produce()
    for _ in range(STEPS):
        kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        if kind == "drain" and len(active()) > 1:
            b = rng.choice(sorted(active()))
            modes[b] = "draining"
            admin.set_mode(cluster.metadata, b, "draining")
        elif kind == "undrain" and any(m != "active" for m in modes.values()):
            b = rng.choice(sorted(b for b, m in modes.items() if m == "drained"))
            modes[b] = "active"
            admin.set_mode(cluster.metadata, b, "active")
        elif kind == "move":
            t = rng.choice(topics)
            placed = read_snapshot(cluster.metadata).placements[t][0].broker
            targets = sorted(active() - {placed})
            if not targets:
                continue
            target = rng.choice(targets)
            admin.request_move(cluster.metadata, t, target)
            wait_for(lambda: all_owned(cluster, [t], {target}), f"move of {t} to {target} (seed {seed})")
        elif kind == "new_topic":
            t = f"/default/r{seed}-{len(topics)}"
            topics.append(t)
            admin.request_topic(cluster.metadata, t)
        elif kind == "restart":
            placed = {p.broker for p, _ in read_snapshot(cluster.metadata).placements.values()}
            b = rng.choice(sorted(placed))
            cluster.kill(b)  # crash: topics abandoned unsealed, the registration gone
            cluster.broker(b)  # same id, same WAL directory, within the grace
        elif kind == "leader_crash":
            leader = next((m for m in managers if m.election.is_leader()), None)
            if leader is None:
                continue
            term = leader.election.current().term
            leader.stop(resign=False)  # no resignation: the others wait for the lease to lapse
            managers.remove(leader)
            managers.append(cluster.manager(f"lm-{len(cluster.managers)}", CONFIG, RUNTIME).start())
            wait_for(lambda: any((m.election.current() or 0) and m.election.current().term > term
                                 for m in managers), f"a new leader (seed {seed})")
        else:
            continue
        log.append(kind)
        settle(kind)
        produce()
    for t in topics:
        offsets = acked[t]
        assert offsets == list(range(len(offsets))), f"seed {seed} {log}: {t} acked {offsets}"
        messages = read_all(host_of(cluster, t), 0, len(offsets) - 1)
        assert [m.offset for m in messages] == offsets, f"seed {seed} {log}: {t}"
        assert [m.payload for m in messages] == [f"{t}:{i}".encode() for i in range(len(offsets))]
        report = verify_topic(t, cluster.metadata, cluster.objects)
        assert report.ok, (seed, log, report.problems)
    assert not [h for h in admin.history(cluster.metadata)["history"] if h["kind"] == "failover"]
    assert_one_assignment_per_topic(cluster)
