"""``dnb cluster ...`` against a live in-process cluster with a leader: every command's
JSON, and the operator inputs (assign, move, drain/undrain, pause/resume) acted on."""
from __future__ import annotations

from tests.cli.helpers import dnb
from tests.cluster.lm_fixtures import FAST_LM, InProcessCluster, wait_for
from tests.tiered.helpers_lifecycle import local_stores
from tiered.cluster.observe import read_snapshot

TOPICS = ["/default/cli-a", "/default/cli-b", "/default/cli-c"]


def test_cluster_commands(tmp_path):
    metadata, objects = local_stores(str(tmp_path))
    cluster = InProcessCluster(str(tmp_path), metadata, objects)
    argv = ["--data-dir", str(tmp_path / "cli"), "--metadata", f"sqlite:///{tmp_path}/metadata.db",
            "--objects", f"file://{tmp_path}/objects"]

    def run(*args: str) -> dict:
        result = dnb(*argv, "--json", "cluster", *args)
        assert result.rc == 0, result.err
        return result.json()

    def owned_on(topic: str, broker: str) -> bool:
        p = read_snapshot(metadata).placements.get(topic)
        return p is not None and p[0].state == "owned" and p[0].broker == broker

    try:
        assert run("leader") == {"leader": None}
        for b in ("1", "2"):
            cluster.broker(b)
        lm = cluster.manager("lm-a", FAST_LM).start()
        wait_for(lm.election.is_leader, "a leader")
        leader = run("leader")
        assert leader["leader"] == "lm-a" and leader["term"] > 0
        for t in TOPICS:
            assert run("assign", t, "--to", "1") == {"topic": t, "to": "1", "requested": True}
        again = dnb(*argv, "--json", "cluster", "assign", TOPICS[0])
        assert again.rc == 3 and again.json()["requested"] is False  # already requested/placed
        wait_for(lambda: all(owned_on(t, "1") for t in TOPICS), "the hinted placements")
        brokers = {b["broker_id"]: b for b in run("brokers")["brokers"]}
        assert brokers["1"]["topics"] == 3 and brokers["2"]["topics"] == 0
        assert brokers["1"]["registered"] and brokers["1"]["mode"] == "active"
        assert brokers["1"]["report_age_s"] is not None
        balance = run("balance", "--strategy", "fair")
        assert balance["strategy"] == "fair" and balance["balance"]["max_load"] == 3.0
        assert [r["broker_id"] for r in balance["rankings"]] == ["2", "1"]
        plan = run("rebalance", "--dry-run", "--strategy", "fair")
        assert plan["dry_run"] is True and all(m["source"] == "1" and m["target"] == "2" for m in plan["moves"])
        assert run("moves") == {"in_flight": [], "requests": []}

        assert run("move", TOPICS[0], "--to", "2")["requested"] is True
        wait_for(lambda: owned_on(TOPICS[0], "2"), "the manual move")
        history = run("history", "--topic", TOPICS[0])["history"]
        assert [(h["kind"], h["from_broker"], h["to_broker"]) for h in history] == [("manual", "1", "2")]
        assert history[0]["completed_at"] is not None

        assert run("pause") == {"paused": True}
        assert read_snapshot(metadata).overrides.paused is True
        assert run("resume") == {"paused": False}

        assert run("drain", "1") == {"broker_id": "1", "mode": "draining"}
        wait_for(lambda: all(owned_on(t, "2") for t in TOPICS), "the drain")
        wait_for(lambda: {b["broker_id"]: b["mode"] for b in run("brokers")["brokers"]}["1"] == "drained",
                 "broker 1 drained")
        assert run("undrain", "1") == {"broker_id": "1", "mode": "active"}
        assert len(run("history")["history"]) == 3
        refused = dnb(*argv, "--json", "cluster", "move", TOPICS[0], "--to", "2")
        assert refused.rc != 0 and "already on 2" in refused.json()["error"]["message"]
        # Without --dry-run the leader runs one cycle now and answers (paused: nothing moves).
        assert run("pause") == {"paused": True}
        asked = dnb(*argv, "--json", "cluster", "rebalance", "--timeout", "60")
        assert asked.rc == 3 and asked.json()["answered"] is True and asked.json()["outcome"] == "Paused"
        assert dnb(*argv, "cluster", "rebalance", "--strategy", "fair").rc == 2  # a what-if of --dry-run only
    finally:
        cluster.close()
        metadata.close()
