"""Real ``dnb broker run --load-manager`` processes: the elected leader places new
topics, rebalances them, drains a broker, and a second leader takes over when the
first one's broker is stopped — while a producer writes through the HTTP client.
Every acknowledged offset is read back exactly once with its payload, offsets are
contiguous, and ``dnb verify`` is OK for every topic."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.cli.helpers import dnb
from tests.cluster.lm_fixtures import wait_for
from tests.fixtures.servers import free_port
from tests.tiered.helpers_lifecycle import store_urls
from tiered.broker.client import SyncBrokerClient
from tiered.cluster import admin
from tiered.cluster.observe import read_snapshot
from tiered.archive import last_committed_offset
from tiered.metadata import keys, open_metadata

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG_GUARD_S = 60.0
TOPICS = ["/default/lmp-a", "/default/lmp-b", "/default/lmp-c"]

LM_CONFIG = {
    "assignment_strategy": "fair",
    "load_report_interval_s": 0.2,
    "report_stale_intervals": 25,
    "rebalancing": {"enabled": True, "check_interval_s": 0.1, "cv_threshold": 0.2, "max_moves_per_hour": 20,
                    "cooldown_s": 0, "min_topic_age_s": 0, "hit_count": 1, "settle_delay_s": 0},
    "failover": {"grace_s": 0, "grace_unstable_s": 0, "stable_after_s": 0},
    "leader_ttl_s": 2.0,
    "poll_interval_s": 0.3,
}


#: Every process this module starts (see ``_no_process_outlives_its_test``).
_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test():
    """A test that fails skips its own SIGTERMs: whatever it started and is still
    running afterwards is SIGKILLed here, so it cannot load the machine for the tests
    that follow."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(HANG_GUARD_S)


class LmBroker:
    def __init__(self, root, broker_id: str, stores: tuple[str, str], config_path: str,
                 load_manager: bool = True, port: int | None = None, settings: tuple[str, ...] = ()) -> None:
        self.broker_id = broker_id
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = ["--data-dir", str(root / f"broker-{broker_id}"), "--metadata", stores[0],
                     "--objects", stores[1], "--broker-id", broker_id]
        env = {**os.environ, "PYTHONPATH": REPO, "GRPC_VERBOSITY": "ERROR"}
        self.log = open(root / f"broker-{broker_id}.log", "a")
        settings = tuple(arg for setting in settings for arg in ("--set", setting))
        lm = ["--load-manager", "--load-manager-config", config_path] if load_manager else \
            ["--load-report-interval-s", str(LM_CONFIG["load_report_interval_s"])]
        self.proc = subprocess.Popen([sys.executable, "-m", "tiered.tools.cli.main", *self.argv, *settings,
                                      "broker", "run", "--listen", f"127.0.0.1:{self.port}", *lm],
                                     env=env, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        _STARTED.append(self.proc)
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            assert self.proc.poll() is None, open(self.log.name).read()
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if json.load(r)["ok"]:
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "hang guard: broker did not start"
            time.sleep(0.05)

    def terminate(self) -> int:
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(HANG_GUARD_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()


def producer_thread(urls: list[str], acked: dict[str, dict[int, bytes]], errors: list[str],
                    stop: threading.Event,
                    reassigned: dict[str, dict[int, bytes]] | None = None) -> threading.Thread:
    """Produces to every topic in turn through the HTTP client (durable acks) until
    ``stop``; each acknowledged offset is recorded with its payload, and a produce that
    was not acknowledged is only counted as an error (allowed). An offset acknowledged
    twice fails the thread's assertion, unless ``reassigned`` is given (a failover may
    number again what a dead owner never archived): the earlier payload goes there, to
    be found in a recorded lost range."""
    def produce() -> None:
        with SyncBrokerClient(urls, timeout_s=HANG_GUARD_S) as client:
            i = 0
            while not stop.is_set():
                topic = TOPICS[i % len(TOPICS)]
                payload = b"%s:%d" % (topic.encode(), i)
                try:
                    [offset] = client.produce(topic, [payload], ack="durable")
                    if reassigned is not None and offset in acked[topic]:
                        reassigned.setdefault(topic, {})[offset] = acked[topic].pop(offset)
                    assert offset not in acked[topic], f"{topic}: offset {offset} acknowledged twice"
                    acked[topic][offset] = payload
                except AssertionError:
                    raise
                except Exception as e:  # noqa: BLE001 - not acknowledged: allowed
                    errors.append(f"{topic} {i}: {type(e).__name__}")
                    time.sleep(0.02)
                i += 1

    return threading.Thread(target=produce)


@pytest.fixture(params=["local", "etcd+s3"])
def stores(request, tmp_path) -> tuple[str, str]:
    return store_urls(request, request.param, str(tmp_path))


def test_load_manager_places_rebalances_drains_and_fails_over_under_a_producer(tmp_path, stores):
    config_path = str(tmp_path / "lm.json")
    with open(config_path, "w") as f:
        json.dump(LM_CONFIG, f)
    brokers = {b: LmBroker(tmp_path, b, stores, config_path) for b in ("1", "2", "3")}
    metadata = open_metadata(stores[0])
    acked: dict[str, dict[int, bytes]] = {t: {} for t in TOPICS}
    errors: list[str] = []
    stop = threading.Event()

    def placements() -> dict:
        return {t: p for t, (p, _) in read_snapshot(metadata).placements.items()}

    def settled(allowed: set[str]) -> bool:
        ps = placements()
        return all(t in ps and ps[t].state == "owned" and ps[t].broker in allowed for t in TOPICS)

    producer = producer_thread([b.url for b in brokers.values()], acked, errors, stop)
    try:
        wait_for(lambda: admin.leader(metadata)["leader"] is not None, "a leader", HANG_GUARD_S)
        def leaders_by_metrics() -> list[str]:
            found = []
            for b in brokers.values():
                with urllib.request.urlopen(b.url + "/metrics", timeout=10) as r:
                    if "dnb_lm_is_leader 1.0" in r.read().decode():
                        found.append(b.broker_id)
            return found

        assert wait_for(lambda: leaders_by_metrics() == [admin.leader(metadata)["leader"]],
                        "the leader's /metrics to say so", HANG_GUARD_S)
        for t in TOPICS:  # all hinted onto broker 1: the rebalancer has work to do
            assert admin.request_topic(metadata, t, to_broker="1")
        wait_for(lambda: settled({"1", "2", "3"}), "the topics placed", HANG_GUARD_S)
        producer.start()
        # Fair strategy, three topics, three brokers: balanced means one topic each.
        wait_for(lambda: settled({"1", "2", "3"}) and len({p.broker for p in placements().values()}) == 3,
                 "automatic rebalancing to one topic per broker", HANG_GUARD_S)
        auto = [h for h in admin.history(metadata)["history"] if h["kind"] == "auto"]
        assert len(auto) >= 2

        drained = dnb(*brokers["2"].argv, "--json", "cluster", "drain", "2")
        assert drained.rc == 0, drained.err
        wait_for(lambda: settled({"1", "3"}) and read_snapshot(metadata).modes["2"][0].mode == "drained",
                 "broker 2 drained", HANG_GUARD_S)

        leader = admin.leader(metadata)
        first = leader["leader"]
        survivor = "3" if first == "1" else "1"
        assert brokers[first].terminate() == 0  # seals its topics, resigns, deregisters
        wait_for(lambda: admin.leader(metadata)["leader"] not in (None, first), "a new leader", HANG_GUARD_S)
        assert admin.leader(metadata)["term"] > leader["term"]
        allowed = {survivor} if first != "2" else {"1", "3"}
        wait_for(lambda: settled(allowed), "the stopped broker's topics failed over", HANG_GUARD_S)
        before = {t: len(acked[t]) for t in TOPICS}
        # Enough traffic to mean something, however slowly a loaded machine produces.
        wait_for(lambda: all(len(acked[t]) > max(before[t], 5) for t in TOPICS), "produce after the failover",
                 HANG_GUARD_S)
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(HANG_GUARD_S)
        live = [b for b in brokers.values() if b.proc.poll() is None]
    try:
        read_back([b.url for b in live], acked, errors)
    finally:
        codes = [b.terminate() for b in live]
        metadata.close()
    assert codes == [0] * len(codes)
    for t in TOPICS:
        verify = dnb(*brokers["1"].argv, "--json", "verify", t)
        assert verify.rc == 0 and verify.json()["ok"], verify.out


class LmProcess:
    """``dnb cluster run``: a load-manager candidate without a broker."""

    def __init__(self, root, name: str, stores: tuple[str, str], config_path: str) -> None:
        self.name = name
        self.log_path = root / f"{name}.log"
        self.log = open(self.log_path, "w")
        env = {**os.environ, "PYTHONPATH": REPO, "GRPC_VERBOSITY": "ERROR"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tiered.tools.cli.main", "--data-dir", str(root / name),
                                      "--metadata", stores[0], "--objects", stores[1], "--broker-id", name,
                                      "cluster", "run", "--load-manager-config", config_path],
                                     env=env, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
        _STARTED.append(self.proc)

    def logged(self, text: str) -> bool:
        with open(self.log_path) as f:
            return text in f.read()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(HANG_GUARD_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()


def read_back(urls: list[str], acked: dict[str, dict[int, bytes]], errors: list[str],
              lost: dict[str, list[keys.LostRange]] | None = None) -> None:
    """Every topic's offsets are contiguous and each is read once; every acknowledged
    offset is read with its payload, unless a recorded, exact lost range of ``lost``
    holds it (a failover reassigned it: reported, never silent)."""
    with SyncBrokerClient(urls, timeout_s=HANG_GUARD_S) as client:
        for t, sent in acked.items():
            got: dict[int, bytes] = {}
            offsets: list[int] = []
            position, deadline = 0, time.monotonic() + HANG_GUARD_S
            last = max(sent) if sent else -1
            while position <= last:
                batch = client.read(t, position, max_messages=500, wait_s=0.2)
                offsets += [m["offset"] for m in batch.messages]
                got.update((m["offset"], m["payload"]) for m in batch.messages)
                position = batch.next_offset
                assert time.monotonic() < deadline, f"hang guard reading {t}"
            assert offsets == list(range(len(offsets))), f"{t}: not contiguous / not once each"
            ranges = [r for r in (lost or {}).get(t, []) if r.end_offset is not None]
            assert all(r.exact for r in ranges), f"{t}: a lost range is not exact: {ranges}"
            recorded = {o for r in ranges for o in range(r.start_offset, r.end_offset + 1)}
            kept = {o: p for o, p in sent.items() if o not in recorded}
            assert set(kept) <= set(got), f"{t}: acked offsets never read: {sorted(set(kept) - set(got))[:10]}"
            assert all(got[o] == p for o, p in kept.items()), f"{t}: payload differs"
            assert len(sent) > 5, f"{t}: too little traffic ({errors[:5]})"


def test_leader_sigkilled_mid_move_the_next_one_finishes_within_the_hourly_limit(tmp_path, stores):
    """Standalone load managers (``dnb cluster run``) over three plain brokers. The leader
    is SIGKILLed while its first automatic move is in flight; the other one wins once the
    lease lapses, finishes the move, and — the hourly budget being one move — makes no
    other automatic move though the cluster is still imbalanced. A drain (exempt from the
    limit) then empties broker 1. Producer throughout; every acked offset read once."""
    config = json.loads(json.dumps(LM_CONFIG))
    config["rebalancing"]["max_moves_per_hour"] = 1
    config_path = str(tmp_path / "lm.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    brokers = {b: LmBroker(tmp_path, b, stores, config_path, load_manager=False) for b in ("1", "2", "3")}
    metadata = open_metadata(stores[0])
    admin.set_paused(metadata, True)  # place first, then let the rebalancer loose
    managers = {n: LmProcess(tmp_path, n, stores, config_path) for n in ("lm-a", "lm-b")}
    acked: dict[str, dict[int, bytes]] = {t: {} for t in TOPICS}
    errors: list[str] = []
    stop = threading.Event()

    def placements() -> dict:
        return {t: p for t, (p, _) in read_snapshot(metadata).placements.items()}

    def settled(allowed: set[str]) -> bool:
        ps = placements()
        return all(t in ps and ps[t].state == "owned" and ps[t].broker in allowed for t in TOPICS)

    def auto_moves() -> list[dict]:
        return [h for h in admin.history(metadata)["history"] if h["kind"] == "auto"]

    producer = producer_thread([b.url for b in brokers.values()], acked, errors, stop)
    try:
        for t in TOPICS:
            assert admin.request_topic(metadata, t, to_broker="1")
        wait_for(lambda: settled({"1"}), "the topics placed on broker 1", HANG_GUARD_S)
        producer.start()
        first = wait_for(lambda: admin.leader(metadata)["leader"], "a leader", HANG_GUARD_S)
        term = admin.leader(metadata)["term"]
        admin.set_paused(metadata, False)
        wait_for(lambda: auto_moves(), "the first automatic move to start", HANG_GUARD_S)
        assert managers[first].stop(signal.SIGKILL) == -signal.SIGKILL  # mid-move (or just after)
        other = managers["lm-b" if first == "lm-a" else "lm-a"]
        wait_for(lambda: admin.leader(metadata)["leader"] == other.name, "the other manager to win", HANG_GUARD_S)
        assert admin.leader(metadata)["term"] > term
        wait_for(lambda: settled({"1", "2", "3"}) and auto_moves()[0]["completed_at"], "the move finished",
                 HANG_GUARD_S)
        wait_for(lambda: other.logged("RateLimit"), "the new leader to hit the persisted hourly limit",
                 HANG_GUARD_S)
        assert len(auto_moves()) == 1
        assert dnb(*brokers["1"].argv, "--json", "cluster", "drain", "1").rc == 0
        wait_for(lambda: settled({"2", "3"}), "broker 1 drained despite the hourly limit", HANG_GUARD_S)
        before = {t: len(acked[t]) for t in TOPICS}
        # Enough traffic to mean something, however slowly a loaded machine produces.
        wait_for(lambda: all(len(acked[t]) > max(before[t], 5) for t in TOPICS), "produce after the drain",
                 HANG_GUARD_S)
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(HANG_GUARD_S)
        for m in managers.values():
            m.stop()
    try:
        read_back([b.url for b in brokers.values()], acked, errors)
    finally:
        codes = [b.terminate() for b in brokers.values()]
        metadata.close()
    assert codes == [0, 0, 0]
    for t in TOPICS:
        verify = dnb(*brokers["1"].argv, "--json", "verify", t)
        assert verify.rc == 0 and verify.json()["ok"], verify.out


def test_a_sigkilled_broker_fails_over_and_its_loss_is_recorded_exactly(tmp_path, stores):
    """A broker SIGKILLed under a producer: once its session lease lapses the leader
    fails its topics over to the other brokers, and the producer goes on there. The
    failover loses what the dead broker made durable but had not archived yet (it
    uploads every 0.3 s, so a short tail), exactly as the lifecycle's failover does
    without a load manager, and records it: once the broker is back on its own disk it
    quarantines its WALs and makes each lost range exact. Every acknowledged offset is
    then read back once with its payload unless an exact recorded range holds it;
    offsets are contiguous; ``dnb verify`` reports exactly the recorded loss (exit 6 if
    anything was lost, 0 with ``--allow-recorded-loss``)."""
    config = json.loads(json.dumps(LM_CONFIG))
    config["rebalancing"]["enabled"] = False  # placements change only by the failover
    config_path = str(tmp_path / "lm.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    settings = ("uploader.interval_s=0.3", "uploader.object_age_max_s=0.3")
    brokers = {b: LmBroker(tmp_path, b, stores, config_path, settings=settings) for b in ("1", "2", "3")}
    metadata = open_metadata(stores[0])
    acked: dict[str, dict[int, bytes]] = {t: {} for t in TOPICS}
    reassigned: dict[str, dict[int, bytes]] = {}
    errors: list[str] = []
    stop = threading.Event()

    def settled(allowed: set[str]) -> bool:
        ps = {t: p for t, (p, _) in read_snapshot(metadata).placements.items()}
        return all(t in ps and ps[t].state == "owned" and ps[t].broker in allowed for t in TOPICS)

    def lost_ranges() -> dict[str, list[keys.LostRange]]:
        return {t: keys.read_lost_ranges(metadata, t) for t in TOPICS}

    producer = producer_thread([b.url for b in brokers.values()], acked, errors, stop, reassigned)
    try:
        wait_for(lambda: admin.leader(metadata)["leader"] is not None, "a leader", HANG_GUARD_S)
        for t in TOPICS:
            assert admin.request_topic(metadata, t, to_broker="1")
        wait_for(lambda: settled({"1"}), "the topics placed on broker 1", HANG_GUARD_S)
        producer.start()
        wait_for(lambda: all(last_committed_offset(metadata, t) is not None for t in TOPICS),
                 "part of every topic archived", HANG_GUARD_S)
        before = {t: len(acked[t]) for t in TOPICS}
        wait_for(lambda: all(len(acked[t]) > before[t] + 5 for t in TOPICS), "more traffic on broker 1",
                 HANG_GUARD_S)
        dead = brokers["1"]
        dead.proc.send_signal(signal.SIGKILL)
        assert dead.proc.wait(HANG_GUARD_S) == -signal.SIGKILL
        dead.log.close()
        wait_for(lambda: settled({"2", "3"}), "broker 1's topics failed over", HANG_GUARD_S)
        before = {t: len(acked[t]) for t in TOPICS}
        wait_for(lambda: all(len(acked[t]) > before[t] + 5 for t in TOPICS), "traffic after the failover",
                 HANG_GUARD_S)
        # Back on the same disk (and port): its host retires each stale WAL.
        brokers["1"] = LmBroker(tmp_path, "1", stores, config_path, port=dead.port, settings=settings)
        wait_for(lambda: all(len(rs) == 1 and rs[0].exact for rs in lost_ranges().values()),
                 "one exact lost range per failed-over topic", HANG_GUARD_S)
    finally:
        stop.set()
        if producer.is_alive():
            producer.join(HANG_GUARD_S)
    try:
        lost = lost_ranges()
        assert all(r.broker_id == "1" for rs in lost.values() for r in rs), lost
        read_back([b.url for b in brokers.values()], acked, errors, lost)
        for t, earlier in reassigned.items():  # numbered again: only inside a recorded range
            ranges = [(r.start_offset, r.end_offset) for r in lost[t] if r.end_offset is not None]
            outside = [o for o in earlier if not any(a <= o <= b for a, b in ranges)]
            assert not outside, f"{t}: offsets {outside[:10]} numbered again outside the recorded loss {ranges}"
    finally:
        codes = [b.terminate() for b in brokers.values()]
        metadata.close()
    assert codes == [0, 0, 0]
    for t in TOPICS:
        verify = dnb(*brokers["2"].argv, "--json", "verify", t)
        lost_something = any(r.end_offset is not None for r in lost[t])
        assert verify.rc == (6 if lost_something else 0), verify.out
        accepted = dnb(*brokers["2"].argv, "--json", "verify", t, "--allow-recorded-loss")
        assert accepted.rc == 0, accepted.out
