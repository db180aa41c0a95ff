"""``dnb cluster rebalance`` (without ``--dry-run``): the leader runs one rebalancing
cycle now, answering the operator's request record, under every rule of automatic
rebalancing (hysteresis thresholds, hourly limit, cooldowns, blacklist, pause). Real
in-process brokers on SQLite + a local directory and on real etcd + S3 (moto over
HTTP); every acknowledged offset read back.

Free of timing assumptions: the leader's lease is long (no slow step can end its term),
reports cannot go stale during the test, an answer that only says "not yet" (warming
up, settling, a report late, a request withdrawn unanswered) is asked again, and every
wait that ends on an event has a generous bound."""
from __future__ import annotations

import pytest

from tiered.cluster import admin, records
from tiered.cluster.config import RebalancingConfig, Strategy
from tiered.cluster.observe import read_snapshot
from tiered.cluster.actions import Transfer
from tiered.cluster.leader import LeaderElection
from tiered.cluster.runtime import Executor
from tiered.cluster.view import MoveKind
from tiered.metadata import open_metadata
from tiered.metadata.base import Delete
from tiered.objects import open_objects
from tests.cli.helpers import dnb
from tests.cluster.lm_fixtures import FAST_LM, FAST_RUNTIME, InProcessCluster, replace, wait_for
from tests.cluster.test_runtime import TOPICS, all_owned, check_continuity, placements, produce
from tests.tiered.helpers_lifecycle import store_urls

BLACKLISTED = TOPICS[0]
CONFIG = replace(FAST_LM, assignment_strategy=Strategy.FAIR, load_report_interval_s=0.5,
                 # Reports come every 0.1 s; stale only after 120 s (a loaded machine's
                 # late report must not make the answer "Stale").
                 report_stale_intervals=240.0,
                 rebalancing=RebalancingConfig(enabled=False, check_interval_s=3600.0, max_moves_per_hour=2,
                                               cooldown_s=0.0, min_topic_age_s=0.0, hit_count=5,
                                               settle_delay_s=0.0, cv_threshold=0.2,
                                               blacklist_topics=("/default/lm-0",)))
#: A lease no slow step can outlive: the test's leader term ends only when it resigns.
RUNTIME = replace(FAST_RUNTIME, leader_ttl_s=120.0)
#: The bound of every wait that ends on an event (an answer, a move completing).
EVENT_WAIT_S = 120.0
#: Answers that only say "not yet": ask again.
NOT_YET = ("WarmingUp", "Settling", "Stale")


@pytest.fixture(params=["local", "etcd+s3"])
def stores(request, tmp_path) -> tuple[str, str]:
    """(metadata URL, objects URL): the embedded stores, or real etcd and moto over HTTP."""
    return store_urls(request, request.param, str(tmp_path))


def _request_until(metadata, done, what: str) -> dict:
    """Ask until the answer is not a transient skip (the brokers' reports since the
    last move, which the Settling gate waits for)."""
    answers = []

    def ask():
        answer = admin.request_rebalance(metadata, timeout_s=EVENT_WAIT_S)
        answers.append(answer)
        return answer if answer["answered"] and done(answer) else None

    return wait_for(ask, f"{what} (answers so far: {[a['outcome'] for a in answers][-5:]})",
                    timeout_s=EVENT_WAIT_S, poll_s=0.1)


def test_operator_rebalance_runs_one_cycle_under_the_rules(tmp_path, stores):
    metadata, objects = open_metadata(stores[0]), open_objects(stores[1])
    cluster = InProcessCluster(str(tmp_path), metadata, objects)
    argv = ["--data-dir", str(tmp_path / "cli"), "--metadata", stores[0], "--objects", stores[1]]
    try:
        # No leader: the request is withdrawn when the wait ends, and leaves nothing pending.
        answer = admin.request_rebalance(metadata, timeout_s=0.3)
        assert answer["answered"] is False and "withdrawn" in answer["outcome"]
        assert metadata.get(records.REBALANCE_REQUEST_KEY) is None

        for b in ("1", "2", "3"):
            cluster.broker(b)
            cluster.reporters[b].interval_s = 0.1
            cluster.reporters[b].start()
        lm = cluster.manager("lm-a", CONFIG, RUNTIME).start()
        for t in TOPICS:
            admin.request_topic(metadata, t, to_broker="1")  # all on one broker: CV is high
        wait_for(lambda: all_owned(cluster, TOPICS, {"1"}), "every topic on broker 1", timeout_s=EVENT_WAIT_S)
        acked: dict[str, list[int]] = {t: [] for t in TOPICS}
        produce(cluster, acked, 3)

        def auto_moves() -> list[dict]:
            return [h for h in admin.history(metadata)["history"] if h["kind"] == MoveKind.AUTO.value]

        # Automatic rebalancing is off: nothing moves until asked. One request = one move,
        # although hit_count (5) consecutive checks were never seen: the request confirms.
        first = _request_until(metadata, lambda a: a["outcome"] not in NOT_YET, "the first cycle")
        assert first["answered"] and first["outcome"] == "moved" and len(first["moves"]) == 1, first
        [move] = first["moves"]
        assert move["from"] == "1" and move["topic"] != BLACKLISTED and move["cv_after"] < move["cv_before"]
        wait_for(lambda: all_owned(cluster, TOPICS), "the first move to complete", timeout_s=EVENT_WAIT_S)
        assert [h["topic"] for h in auto_moves()] == [move["topic"]]
        produce(cluster, acked, 3)

        second = _request_until(metadata, lambda a: a["outcome"] not in NOT_YET, "the second cycle")
        assert second["outcome"] == "moved" and second["moves"][0]["topic"] not in (BLACKLISTED, move["topic"])
        wait_for(lambda: all_owned(cluster, TOPICS), "the second move to complete", timeout_s=EVENT_WAIT_S)

        # The hourly limit (2) is spent: the CLI's request is answered RateLimit, exit 3.
        def via_cli():
            result = dnb(*argv, "--json", "cluster", "rebalance", "--timeout", str(EVENT_WAIT_S))
            answer = result.json()
            return result if answer["answered"] and answer["outcome"] not in NOT_YET else None
        result = wait_for(via_cli, "a settled check through the CLI", timeout_s=EVENT_WAIT_S, poll_s=0.1)
        assert result.rc == 3 and result.json()["outcome"] == "RateLimit" and result.json()["answered"] is True
        assert len(auto_moves()) == 2
        assert placements(cluster)[BLACKLISTED].broker == "1"  # never moved: blacklisted

        admin.set_paused(metadata, True)
        assert admin.request_rebalance(metadata, timeout_s=EVENT_WAIT_S)["outcome"] == "Paused"
        assert len(auto_moves()) == 2
        assert lm.election.is_leader()
        produce(cluster, acked, 3)
        check_continuity(cluster, acked)
    finally:
        cluster.close()
        metadata.close()
        objects.close()


def test_a_withdrawn_request_never_moves_anything(tmp_path, stores):
    """The move and the answer are one write compared on the request: once the operator
    withdrew its request, a decision made from it lands nothing."""
    metadata, objects = open_metadata(stores[0]), open_objects(stores[1])
    cluster = InProcessCluster(str(tmp_path), metadata, objects)
    try:
        for b in ("1", "2"):
            cluster.broker(b)
        lm = cluster.manager("lm-a", replace(CONFIG, load_report_interval_s=3600.0), RUNTIME).start()
        for t in TOPICS[:4]:
            admin.request_topic(metadata, t, to_broker="1")
        wait_for(lambda: all_owned(cluster, TOPICS[:4], {"1"}), "four topics on broker 1", timeout_s=EVENT_WAIT_S)
        lm.stop(resign=True)
        election = LeaderElection(metadata, "writer", ttl_s=RUNTIME.leader_ttl_s)
        election.tick()
        token = election.current()
        assert token is not None
        record = records.RebalanceRequestRecord("r-1", 1.0, "test")
        metadata.put(records.REBALANCE_REQUEST_KEY, records.encode(record))
        snap = read_snapshot(metadata)
        assert snap.rebalance_request is not None
        action = Transfer(TOPICS[1], "1", "2", MoveKind.AUTO, "m-1", 0.2, 0.5, 0.2, rebalance_request="r-1")
        metadata.txn([], [Delete(records.REBALANCE_REQUEST_KEY)])  # the operator gave up
        before = placements(cluster)[TOPICS[1]]
        assert Executor(metadata).apply(action, snap, token) is False
        assert placements(cluster)[TOPICS[1]] == before and before.state == "owned"
        assert metadata.get(records.REBALANCE_REQUEST_KEY) is None
        # With the request in place the same write lands, answering it.
        metadata.put(records.REBALANCE_REQUEST_KEY, records.encode(record))
        snap = read_snapshot(metadata)
        assert Executor(metadata).apply(action, snap, token) is True
        answered = records.decode(records.RebalanceRequestRecord, "k",
                                  metadata.get(records.REBALANCE_REQUEST_KEY).value)
        assert answered.state == "answered" and answered.outcome == "moved"
        assert answered.moves[0]["topic"] == TOPICS[1] and placements(cluster)[TOPICS[1]].state == "releasing"
        election.resign()
    finally:
        cluster.close()
        metadata.close()
        objects.close()
