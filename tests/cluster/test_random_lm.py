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
from tiered.cluster.config import FailoverConfig, RebalancingConfig, Strategy
from tiered.cluster.observe import read_snapshot
from tiered.cluster.runtime import RuntimeConfig
from tests.cluster.lm_fixtures import FAST_LM, InProcessCluster, lm_cluster, replace, wait_for  # noqa: F401
from tests.cluster.test_runtime import all_owned, assert_one_assignment_per_topic, host_of, placements
from tests.tiered.helpers_lifecycle import read_all
from tiered.tools.verify import verify_topic

SEEDS = int(os.environ.get("DNB_LM_SEEDS", "3"))
STEPS = 8
BROKERS = ("1", "2", "3", "4")
CONFIG = replace(FAST_LM, failover=FailoverConfig(grace_s=3600.0, grace_unstable_s=3600.0), drain_parallel=2)
RUNTIME = RuntimeConfig(leader_ttl_s=1.0, poll_interval_s=0.3, debounce_s=0.01)
KINDS = (("drain", 3), ("undrain", 2), ("move", 4), ("new_topic", 2), ("restart", 2), ("leader_crash", 2))


#: Automatic rebalancing on top (Fair: topic counts), checked often, no age/cooldown/settle.
AUTO_CONFIG = replace(CONFIG, assignment_strategy=Strategy.FAIR, load_report_interval_s=0.2,
                      report_stale_intervals=20.0,
                      rebalancing=RebalancingConfig(enabled=True, check_interval_s=0.05, cv_threshold=0.2,
                                                    max_moves_per_hour=1000, cooldown_s=0.0, min_topic_age_s=0.0,
                                                    hit_count=1, settle_delay_s=0.0))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_load_manager_scenario(lm_cluster, seed):
    run_scenario(lm_cluster, seed, CONFIG)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_scenario_with_automatic_rebalancing(lm_cluster, seed):
    """The same schedules with the rebalancer moving topics at any moment: producers
    retry through moves; every acked offset is read once with its payload."""
    run_scenario(lm_cluster, seed, AUTO_CONFIG)


def _produce_one(cluster: InProcessCluster, topic: str, payload: bytes, box: list[int]) -> bool:
    """Append through whichever broker hosts the topic now; False if it did not ack
    (a move under way). An attempt that raised may still have landed: it is simply not
    acknowledged, and the end check allows unacknowledged offsets between acked ones."""
    try:
        box.append(host_of(cluster, topic).produce(payload, timeout_s=5.0))
        return True
    except Exception:  # noqa: BLE001 - fenced, unloading, not hosted yet: not acked
        return False


def run_scenario(cluster: InProcessCluster, seed: int, config) -> None:
    rng = random.Random(f"lm-{seed}")
    auto = config.rebalancing.enabled
    for b in BROKERS:
        cluster.broker(b)
        if auto:
            cluster.reporters[b].interval_s = 0.05
            cluster.reporters[b].start()
    managers = [cluster.manager(f"lm-{i}", config, RUNTIME).start() for i in range(2)]
    topics = [f"/default/r{seed}-{i}" for i in range(3)]
    for t in topics:
        admin.request_topic(cluster.metadata, t)
    acked: dict[str, dict[int, bytes]] = {}
    modes = {b: "active" for b in BROKERS}
    log: list[str] = []

    def active() -> set[str]:
        return {b for b, m in modes.items() if m == "active"}

    def rebalancer_had_its_turn() -> bool:
        """The leader ran a check that was free to move (not warming up, no move in
        flight, settled): whatever it wanted to move, it has started."""
        for m in managers:
            last = m.last
            if last is not None and last.decision is not None and last.decision.checked and \
                    not {"WarmingUp", "InFlight", "Settling", "Stale"} & set(last.decision.skipped):
                return True
        return False

    def settle(what: str) -> None:
        if auto:
            try:
                wait_for(rebalancer_had_its_turn, f"a rebalancing check after {what} (seed {seed})")
            except AssertionError as e:
                snap = read_snapshot(cluster.metadata, owners_for="all")
                raise AssertionError(
                    f"{e}; last checks: {[(m.node_id, m.election.is_leader(), m.last and m.last.decision and (m.last.decision.skipped, m.last.decision.alarms)) for m in managers]}, "
                    f"placements {snap.placements}; owners {snap.owners}; registered "
                    f"{ {b: kv.create_revision for b, kv in snap.registered.items()} }; assignments {snap.assignments}; "
                    f"hosted { {b: [(str(x.topic), x.state) for x in h.topics()] for b, h in cluster.hosts.items()} }; "
                    f"watcher errors { {b: w.errors for b, w in cluster.watchers.items()} }") from None
        try:
            wait_for(lambda: all_owned(cluster, topics, active()), f"{what} (seed {seed}, steps {log})")
        except AssertionError as e:
            snap = read_snapshot(cluster.metadata, owners_for="all")
            raise AssertionError(f"{e}; placements {snap.placements}; assignments {snap.assignments}; "
                                 f"owners {snap.owners}; markers {snap.markers}; hosted "
                                 f"{ {b: [str(x.topic) for x in h.topics()] for b, h in cluster.hosts.items()} }; "
                                 f"watcher errors { {b: w.errors for b, w in cluster.watchers.items()} }; "
                                 f"last {[(m.node_id, m.election.is_leader(), m.last and m.last.decision and (m.last.decision.actions, m.last.decision.alarms), m.last and m.last.refused) for m in managers]}") from None
        if any(m == "draining" for m in modes.values()):
            wait_for(lambda: all(read_snapshot(cluster.metadata).modes[b][0].mode == "drained"
                                 for b, m in modes.items() if m == "draining"), f"drained (seed {seed})")
            for b, m in modes.items():
                if m == "draining":
                    modes[b] = "drained"

    def produce() -> None:
        for t in topics:
            for _ in range(rng.randint(1, 3)):
                sent = acked.setdefault(t, {})
                payload = f"{t}:{seed}:{len(log)}:{len(sent)}".encode()
                if auto:
                    box: list[int] = []
                    wait_for(lambda: _produce_one(cluster, t, payload, box), f"an ack on {t} (seed {seed})")
                    offset = box[0]
                else:
                    offset = host_of(cluster, t).produce(payload)
                assert offset not in sent, f"seed {seed}: {t} offset {offset} acknowledged twice"
                sent[offset] = payload

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
            try:
                admin.request_move(cluster.metadata, t, target)
            except admin.RequestRefused:
                assert auto  # only the rebalancer can have a move of it under way
                continue
            if not auto:  # with the rebalancer on, it may move the topic again right away
                wait_for(lambda: all_owned(cluster, [t], {target}), f"move of {t} to {target} (seed {seed})")
        elif kind == "new_topic":
            t = f"/default/r{seed}-{len(topics)}"
            topics.append(t)
            admin.request_topic(cluster.metadata, t)
        elif kind == "restart":
            placed = {p.broker for p, _ in read_snapshot(cluster.metadata).placements.values()}
            b = rng.choice(sorted(placed))
            cluster.kill(b)  # crash: topics abandoned unsealed, the registration gone
            cluster.reporters.pop(b).stop()
            cluster.broker(b)  # same id, same WAL directory, within the grace
            if auto:
                cluster.reporters[b].interval_s = 0.05
                cluster.reporters[b].start()
        elif kind == "leader_crash":
            leader = next((m for m in managers if m.election.is_leader()), None)
            if leader is None:
                continue
            term = leader.election.current().term
            leader.stop(resign=False)  # no resignation: the others wait for the lease to lapse
            managers.remove(leader)
            managers.append(cluster.manager(f"lm-{len(cluster.managers)}", config, RUNTIME).start())
            wait_for(lambda: any((m.election.current() or 0) and m.election.current().term > term
                                 for m in managers), f"a new leader (seed {seed})")
        else:
            continue
        log.append(kind)
        settle(kind)
        produce()
    for t in topics:
        sent = acked[t]
        if not auto:
            assert sorted(sent) == list(range(len(sent))), f"seed {seed} {log}: {t} acked {sorted(sent)}"
        last = max(sent)
        messages = wait_for(lambda: _read(cluster, t, last), f"reading {t} back")
        offsets = [m.offset for m in messages]
        assert offsets == list(range(last + 1)), f"seed {seed} {log}: {t} read {offsets}"
        got = {m.offset: m.payload for m in messages}
        assert all(got[o] == p for o, p in sent.items()), f"seed {seed} {log}: {t} payloads differ"
        report = verify_topic(t, cluster.metadata, cluster.objects)
        assert report.ok, (seed, log, report.problems)
    assert not [h for h in admin.history(cluster.metadata)["history"] if h["kind"] == "failover"]
    assert_one_assignment_per_topic(cluster)
    if os.environ.get("DNB_LM_SHOW"):
        kinds = [h["kind"] for h in admin.history(cluster.metadata)["history"]]
        print(f"seed {seed} auto={auto} steps {log} moves {sorted(set(kinds))} x{len(kinds)} "
              f"auto moves {kinds.count('auto')}",
              [(m.last.decision.skipped, m.last.decision.balance) for m in managers
               if m.last is not None and m.last.decision is not None])


def _read(cluster: InProcessCluster, topic: str, last: int):
    try:
        return read_all(host_of(cluster, topic), 0, last)
    except Exception:  # noqa: BLE001 - moving right now: read again
        return None
