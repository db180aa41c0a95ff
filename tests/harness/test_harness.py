"""The offset-continuity harness: >= 200 seeds on the embedded defaults, a few with SIGKILLed
broker subprocesses, a few on real etcd + moto, and proof that the checker catches bugs."""
from __future__ import annotations

import logging

import pytest

from tests.cli.helpers import dnb
from tiered.tools.harness import make_schedule, run_many, run_scenario

SEEDS_PER_CHUNK = 25
CHUNKS = 8  # 8 x 25 = 200 seeds


@pytest.fixture(autouse=True)
def _quiet_logs():
    # Injected faults make the library log warnings by design; keep the test output readable.
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_embedded_seeds(chunk):
    summary = run_many(first_seed=chunk * SEEDS_PER_CHUNK, scenarios=SEEDS_PER_CHUNK)
    assert summary["failed"] == 0, summary["failure"]
    assert summary["passed"] == SEEDS_PER_CHUNK


def test_subprocess_sigkill_seeds():
    # Seeds whose schedules include at least one SIGKILL of a real broker process.
    seeds = [s for s in range(1000, 1200) if any(st.kind == "sigkill" for st in
                                                  make_schedule(s, 3, 12, subprocess_crashes=True))][:4]
    assert len(seeds) == 4
    for seed in seeds:
        result = run_scenario(seed, subprocess_crashes=True)
        assert result.ok, result.to_json()
        assert any("SIGKILLed" in note for note in result.notes)


@pytest.mark.etcd
@pytest.mark.s3
def test_real_etcd_and_moto_seeds(etcd_server, etcd_root, moto_server, s3_bucket):
    objects = f"s3://{s3_bucket}/h?endpoint={moto_server.endpoint_url}"
    summary = run_many(first_seed=500, scenarios=4, metadata_url=etcd_server.url + etcd_root, objects_url=objects)
    assert summary["failed"] == 0, summary["failure"]


def test_schedule_is_a_pure_function_of_the_seed():
    assert make_schedule(42) == make_schedule(42)
    assert make_schedule(42) != make_schedule(43)
    kinds = {step.kind for seed in range(200) for step in make_schedule(seed)}
    assert kinds >= {"produce", "produce_nowait", "upload", "consume", "move", "restart", "power_loss",
                     "takeover", "uploader_crash", "s3_fault", "etcd_fault", "failed_load", "disk_full_load",
                     "second_opener", "stale_owner", "delayed_write", "impostor", "lm_move", "lm_drain",
                     "delete_recreate", "archive_retention"}
    hows = {step.args["how"] for seed in range(200) for step in make_schedule(seed) if step.kind == "delete_recreate"}
    assert hows == {"clean", "paused", "crashed"}
    losses = {step.args["leader_loss"] for seed in range(200) for step in make_schedule(seed)
              if step.kind in ("lm_move", "lm_drain")}
    assert losses == {None, "transfer", "released", "assign"}
    strategies = {step.args["strategy"] for seed in range(200) for step in make_schedule(seed)
                  if step.kind == "lm_move"}
    assert strategies == {"balanced", "weighted_load"}


# -- the checker catches real bugs ------------------------------------------------------

def _first_failure(seeds=range(0, 40)):
    summary = run_many(first_seed=seeds.start, scenarios=len(seeds))
    assert summary["failed"] == 1, "the harness did not notice the injected bug"
    return summary


def test_catches_a_restore_that_reuses_an_offset(monkeypatch):
    import tiered.lifecycle.restore as restore
    from tiered.lifecycle import host as lifecycle

    real = restore.plan_restore
    monkeypatch.setattr(lifecycle, "plan_restore", _dataclass_replacing(real, "start_offset", -1))
    summary = _first_failure()
    assert summary["failure"]["violation"].split(":")[0] in (
        "seal-continuity", "takeover-start", "unique-offsets", "unexpected-error")


def _dataclass_replacing(real, field, delta):
    import dataclasses

    def patched(metadata, token):
        plan = real(metadata, token)
        if getattr(plan, field) > 0 and not plan.may_recover_local:
            return dataclasses.replace(plan, **{field: getattr(plan, field) + delta})
        return plan

    return patched


def test_catches_a_reader_that_drops_a_message(monkeypatch):
    from tiered.read import reader as reader_module

    real_next = reader_module.TieredReader.__next__

    def dropping(self):
        message = real_next(self)
        if message.offset == 3 and message.tier == "cloud":
            return real_next(self)  # silently skip offset 3 when it comes from the archive
        return message

    monkeypatch.setattr(reader_module.TieredReader, "__next__", dropping)
    summary = _first_failure()
    # The scenario's topic or a bystander that moved (read through the same reader).
    assert summary["failure"]["violation"].startswith(("contiguous-offsets", "bystander-durable"))


def test_catches_a_seal_that_loses_the_last_message(monkeypatch):
    from tiered.lifecycle import seal

    real_drain = seal.drain

    def short_drain(hosted, config):
        last = real_drain(hosted, config)
        return None if last in (None, 0) else last - 1

    monkeypatch.setattr(seal, "drain", short_drain)
    summary = _first_failure()
    assert summary["failure"]["violation"].split(":")[0] in ("seal-continuity", "unexpected-error")


def test_cli_prints_seed_schedule_and_first_violated_invariant(monkeypatch):
    from tiered.read import reader as reader_module

    real_next = reader_module.TieredReader.__next__

    def duplicating(self):
        message = real_next(self)
        if message.offset == 2 and not getattr(self, "_dup_done", False):
            self._dup_done = True
            self._pending.appendleft(message)  # serve offset 2 twice
        return message

    monkeypatch.setattr(reader_module.TieredReader, "__next__", duplicating)
    run = dnb("harness", "--scenarios", "40")
    assert run.rc == 1
    assert "FAILED seed" in run.out and "first violated invariant: " in run.out
    assert "schedule:" in run.out and "replay: dnb harness --seed" in run.out
    seed = int(run.out.split("FAILED seed ")[1].split()[0])
    replay = dnb("--json", "harness", "--seed", str(seed)).json()
    assert replay["failed"] == 1 and replay["failure"]["seed"] == seed
    assert set(replay) == {"first_seed", "scenarios", "passed", "failed", "elapsed_s", "failure", "replay"}
    assert replay["failure"]["violation"] == run.out.split("first violated invariant: ")[1].splitlines()[0]


def test_catches_a_takeover_that_leaves_cursors_past_the_restart_point(monkeypatch):
    from tiered.lifecycle import host as lifecycle

    monkeypatch.setattr(lifecycle, "clamp_cursors", lambda *args, **kwargs: {})
    summary = _first_failure()
    assert summary["failure"]["violation"].split(":")[0] in ("cursor-clamp", "subscription-exactly-once")


def test_catches_a_returning_broker_that_deletes_its_wal_silently(monkeypatch):
    from tiered.lifecycle import RetiredWal
    from tiered.lifecycle.retire import StaleWals

    def silent_delete(self, topic, start=None, epoch=None):
        self.delete(topic)
        return RetiredWal(topic, 0, None, None, None, 0, None)

    monkeypatch.setattr(StaleWals, "retire", silent_delete)
    summary = _first_failure()
    assert summary["failure"]["violation"].startswith("lost-range-exact")


def test_catches_a_failed_load_that_releases_the_topic(monkeypatch):
    from tiered.lifecycle import host as lifecycle
    from tiered.lifecycle.ownership import release

    def always_release(self, token, plan, wal):
        try:
            release(self.metadata, token)
        except Exception:  # noqa: BLE001 - as the old code did: quietly
            pass

    monkeypatch.setattr(lifecycle.BrokerHost, "_after_failed_load", always_release)
    summary = _first_failure()
    assert summary["failure"]["violation"].split(":")[0] in ("durable-readable", "unique-offsets",
                                                             "failed-load-safe", "lost-range-exact")


def test_catches_a_cursor_write_without_its_revision_compare(monkeypatch):
    from tiered.metadata.base import Put
    from tiered.metadata.owned import OwnedRecord, RecordFenced

    def blind_write(self, value, fencing, covers=lambda stored: False):
        if not self.metadata.txn(list(fencing), [Put(self.key, value)]).succeeded:
            raise RecordFenced(self.key)

    monkeypatch.setattr(OwnedRecord, "write", blind_write)
    summary = _first_failure()
    assert summary["failure"]["violation"].startswith("cursor-monotonic")


def test_catches_a_fenced_owner_that_keeps_acknowledging(monkeypatch):
    from tiered.lifecycle import HostedTopic

    monkeypatch.setattr(HostedTopic, "fence", lambda self, step: None)
    summary = _first_failure()
    assert summary["failure"]["violation"].startswith("fenced-refuses")


def test_catches_a_second_opener_let_in(monkeypatch):
    from wal.testing import FaultFs

    def no_lock(self, path):
        class Nothing:
            def release(self) -> None:
                pass
        return Nothing()

    monkeypatch.setattr(FaultFs, "lock", no_lock)
    summary = _first_failure()
    assert summary["failure"]["violation"].split(":")[0] in ("one-writer", "unexpected-error")


def test_catches_a_reader_that_does_not_check_objects_against_descriptors(monkeypatch):
    from native import object_format

    monkeypatch.setattr(object_format, "check_footer_digest", lambda *args, **kwargs: None)
    monkeypatch.setattr(object_format, "check_block_digest", lambda *args, **kwargs: None)
    summary = _first_failure(range(0, 80))
    assert summary["failure"]["violation"].startswith("object-pinned")


# -- the load-manager steps --------------------------------------------------------------

def _lm_seeds(count: int, leader_loss: bool) -> list[int]:
    return [s for s in range(400) if any(st.kind.startswith("lm_") and (st.args["leader_loss"] is not None)
                                         == leader_loss for st in make_schedule(s))][:count]


def test_load_manager_steps_move_the_topic_and_survive_leader_loss():
    """Seeds with leader-driven moves and drains, the leader lost at each step of a move:
    every invariant holds, and the notes say a new term took over."""
    for seed in _lm_seeds(6, leader_loss=True):
        result = run_scenario(seed)
        assert result.ok, result.to_json()
        assert any("leader lost at" in n for n in result.notes), result.notes


def _lm_move_seeds(count: int) -> list[int]:
    return [s for s in range(400) if any(st.kind == "lm_move" for st in make_schedule(s))][:count]


def test_load_manager_moves_follow_measured_traffic():
    """Both strategies that weigh traffic move the topic to the broker with the least
    measured load (which hosts as many topics as any broker), once the load reports
    show the bytes the harness produced."""
    seeds = _lm_move_seeds(8)
    notes = []
    for seed in seeds:
        result = run_scenario(seed)
        assert result.ok, result.to_json()
        notes += [n for n in result.notes if "on measured load" in n]
    assert any("balanced moved" in n for n in notes) and any("weighted_load moved" in n for n in notes), notes


def test_catches_load_reports_that_miss_the_traffic(monkeypatch):
    from tiered.cluster import reports

    monkeypatch.setattr(reports, "_bytes_in", lambda hosted: 0.0)
    results = [run_scenario(s) for s in _lm_move_seeds(2)]
    assert all(not r.ok and r.violation.startswith("lm-load-report") for r in results), \
        [r.violation for r in results]


def test_catches_a_leader_that_ranks_by_topic_count_alone(monkeypatch):
    """A score model blind to throughput ranks the harness's brokers by their topics:
    the broker with the least traffic is then never the least loaded, and the topic
    does not go there."""
    from tiered.cluster.scoring import ScoreModel

    real_cost = ScoreModel.cost

    def count_only(self, topic):
        count, _, _, _, _ = real_cost(self, topic)
        return (count, 0.0, 0.2, 0.0, 0.0)

    monkeypatch.setattr(ScoreModel, "cost", count_only)
    results = [run_scenario(s) for s in _lm_move_seeds(3)]
    assert all(not r.ok and r.violation.split(":")[0] in ("lm-move-completes", "lm-measured-move")
               for r in results), [r.violation for r in results]


def test_catches_a_leader_write_that_skips_the_fence(monkeypatch):
    from tiered.cluster.leader import LeaderToken

    monkeypatch.setattr(LeaderToken, "fencing", property(lambda self: []))
    seeds = _lm_seeds(10, leader_loss=True)
    results = [run_scenario(s) for s in seeds]
    assert any(not r.ok and r.violation.startswith("lm-fenced") for r in results), [r.violation for r in results]


def test_catches_a_leader_that_never_completes_a_move(monkeypatch):
    from tiered.cluster.runtime import Executor

    monkeypatch.setattr(Executor, "_CompleteTransfer", lambda self, a, snap, token: False)
    [seed] = _lm_seeds(1, leader_loss=False)
    result = run_scenario(seed)
    # Sealed and never assigned: the unowned bound is the first to notice.
    assert not result.ok and result.violation.split(":")[0] in ("lm-unowned-bound", "lm-move-completes"), \
        result.to_json()


def test_catches_a_leader_that_leaves_a_released_topic_unowned_for_a_step(monkeypatch):
    """The target must be assigned in the step that sees the release: a leader whose
    first attempt at each completion is lost finishes every move, one step late."""
    from tiered.cluster.runtime import Executor

    real = Executor._CompleteTransfer
    attempts: dict[tuple[str, str | None], int] = {}

    def late(self, a, snap, token):
        move = (a.topic, a.move_id)
        attempts[move] = attempts.get(move, 0) + 1
        return attempts[move] > 1 and real(self, a, snap, token)

    monkeypatch.setattr(Executor, "_CompleteTransfer", late)
    [seed] = _lm_seeds(1, leader_loss=False)
    result = run_scenario(seed)
    assert not result.ok and result.violation.startswith("lm-unowned-bound"), result.to_json()


def test_a_slow_machine_cannot_end_a_leader_term(monkeypatch):
    """The harness's leader terms end only at its leader-loss steps. Here every reading of
    the lease clock (the store's lease countdown and the election's default clock) is
    5 s later than the one before: a machine so slow that each metadata operation takes
    seconds. Each seed must still pass, with the same leader losses as on a fast machine."""
    from tiered.cluster import leader
    from tiered.metadata import base, sqlite

    real = base.lease_clock
    lag = [0.0]

    def slow_machine() -> float:
        lag[0] += 5.0
        return real() + lag[0]

    monkeypatch.setattr(sqlite, "lease_clock", slow_machine)
    defaults = tuple(slow_machine if d is real else d for d in leader.LeaderElection.__init__.__defaults__)
    monkeypatch.setattr(leader.LeaderElection.__init__, "__defaults__", defaults)
    for seed in _lm_seeds(4, leader_loss=True) + _lm_seeds(2, leader_loss=False):
        result = run_scenario(seed)
        assert result.ok, result.to_json()
        losses = [s for s in result.schedule if s.kind.startswith("lm_") and s.args["leader_loss"] is not None]
        assert sum("leader lost at" in n for n in result.notes) == len(losses), result.notes


def test_a_power_loss_takes_back_every_tip_the_dead_broker_published_after_it(tmp_path, monkeypatch):
    """The model's crash closes the host after the crash image was taken; what that close
    publishes never happened. Here b1 took the topic over from b0 and had published no tip
    yet: after its power loss, b0's record is back (not deleted, not b1's in-memory tip)."""
    import os
    import threading

    from tiered.lifecycle.hosted import HostedTopic
    from tiered.lifecycle.restore import read_progress
    from tiered.tools.harness.cluster import Cluster
    from wal.topics import TopicName

    topic = TopicName.parse("/ns/t")
    os.makedirs(tmp_path / "objects")
    cluster = Cluster(str(tmp_path), 2, topic, f"sqlite:///{tmp_path}/md.db", f"file://{tmp_path}/objects")
    try:
        first = cluster.load(0)
        for i in range(5):
            first.produce(b"m%d" % i)
        first.publish_progress()
        cluster.crash(0)
        before = read_progress(cluster.inner_metadata, topic)
        assert before is not None and before.broker_id == "b0" and before.durable_offset == 4
        imaged = threading.Event()  # b1 publishes nothing until the image is taken
        publish = HostedTopic.publish_progress

        def gated(self, *args, **kwargs):
            if self.token.broker_id == "b1" and not imaged.is_set():
                return False
            return publish(self, *args, **kwargs)

        monkeypatch.setattr(HostedTopic, "publish_progress", gated)
        cluster.load(1).produce(b"after the takeover")
        crash_image = cluster.fs[1].crash_image

        def image_then_publish(**kwargs):
            image = crash_image(**kwargs)
            imaged.set()
            return image

        monkeypatch.setattr(cluster.fs[1], "crash_image", image_then_publish)
        cluster.power_loss(1, torn_bytes=0)
        assert read_progress(cluster.inner_metadata, topic) == before
    finally:
        cluster.close()


# -- delete / re-create and archive retention (tiered.tools.harness.incarnations) --------

def _seeds_with(kind: str, count: int, where=lambda step: True, seeds=range(2000, 2600)) -> list[int]:
    return [s for s in seeds if any(st.kind == kind and where(st) for st in make_schedule(s))][:count]


def test_delete_recreate_steps_in_every_variant():
    """A clean delete with a reader open across it, one past a paused owner whose deleter
    dies mid-delete, one past a dead owner: every invariant holds."""
    seeds = (_seeds_with("delete_recreate", 1, lambda st: st.args["how"] == "clean" and st.args["reader"])
             + _seeds_with("delete_recreate", 1, lambda st: st.args["how"] == "paused"
                           and st.args["crash_at"] is not None)
             + _seeds_with("delete_recreate", 1, lambda st: st.args["how"] == "crashed"))
    assert len(seeds) == 3
    notes = []
    for seed in seeds:
        result = run_scenario(seed)
        assert result.ok, result.to_json()
        notes += result.notes
    assert sum(" delete by b" in n and "re-created on" in n for n in notes) >= 3, notes
    assert any("its re-run resumed" in n for n in notes), notes


def test_archive_retention_steps_cut_where_the_policy_asks():
    """Cuts by size and by age, one interrupted by the owner's crash: the start moves
    exactly where the policy asks, and everything from it on reads exactly once."""
    seeds = (_seeds_with("archive_retention", 2, lambda st: st.args["crash_at"] is None and st.args["rounds"] >= 2)
             + _seeds_with("archive_retention", 1, lambda st: st.args["crash_at"] is not None
                           and st.args["rounds"] >= 2))
    notes = []
    for seed in seeds:
        result = run_scenario(seed)
        assert result.ok, result.to_json()
        notes += result.notes
    assert sum("archive retention" in n and " cut " in n for n in notes) >= 2, notes


def test_catches_a_retention_cut_past_what_the_policy_asks(monkeypatch):
    """A cut that removes one descriptor more than its limits ask for (acknowledged
    messages nobody asked to remove) is retention-bounded."""
    import dataclasses

    from uploader import archive_retention

    real = archive_retention.plan_cut

    def greedy(retained, *args, **kwargs):
        cut = real(retained, *args, **kwargs)
        if cut is None or len(cut.removed) + 1 >= len(retained):
            return cut
        n = len(cut.removed) + 1
        return dataclasses.replace(cut, new_start=retained[n].start_offset, removed=tuple(retained[:n]))

    monkeypatch.setattr(archive_retention, "plan_cut", greedy)
    seeds = _seeds_with("archive_retention", 6, lambda st: st.args["rounds"] >= 2 and st.args["policy"] == "bytes"
                        and 0 < st.args["keep"] < 1)
    results = [run_scenario(s) for s in seeds]
    assert any(not r.ok and r.violation.startswith("retention-bounded") for r in results), \
        [r.violation for r in results]


def test_catches_a_recreate_that_renumbers_the_deleted_incarnation(monkeypatch):
    """A tombstone whose next offset forgets the deleted incarnation's last message: the
    re-created topic would number it again."""
    from tiered.lifecycle import delete

    real = delete._next_offset
    monkeypatch.setattr(delete, "_next_offset", lambda *a: max(0, real(*a) - 1))
    seeds = _seeds_with("delete_recreate", 3, lambda st: st.args["how"] == "clean")
    results = [run_scenario(s) for s in seeds]
    assert all(not r.ok and r.violation.startswith("recreate-continues") for r in results), \
        [r.violation for r in results]
