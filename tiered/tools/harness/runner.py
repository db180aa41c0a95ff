"""Runs one scenario (a seeded schedule) against real brokers and checks every invariant.

Invariants (the names a failure reports):

* ``contiguous-offsets``: the topic's offsets run 0..tip-1 with no hole, each served once,
  in order, through the tiered reader (cloud → WAL).
* ``unique-offsets``: no offset ever names two different messages, across clean moves and
  same-broker restarts; after a takeover only the reported unarchived tail is reassigned.
* ``durable-readable``: every message acknowledged as durable is readable (after a takeover:
  unless it was in the reported unarchived tail).
* ``archived-never-lost``: a message acknowledged as archived survives any takeover.
* ``takeover-start`` / ``takeover-report``: a takeover continues right after the last
  committed descriptor, and never reports more unarchived offsets than really were.
* ``lost-range-exact``: the dead owner keeps its disk; once it is back (at the latest at
  the end of the scenario) the topic's LostRange records are exactly one per takeover,
  each naming exactly the offsets the dead owner's WAL held past the restart point, and
  every reassigned offset lies inside one (reported, never silently lost).
* ``cursor-clamp``: after a takeover every stored cursor past the restart point S is S - 1
  (-1 when S is 0: nothing acknowledged, resume at 0), and the load reports each clamp with
  the old value.
* ``seal-continuity``: seal names the WAL tip, and the next owner starts right after it.
* ``unload-failure-safe``: a failed seal leaves the topic unsealed and hosted with its WAL,
  and retrying resumes.
* ``subscription-exactly-once``: each subscription resumes right after its cursor and sees
  every later message once, across moves (no acknowledged payload is delivered twice,
  no offset after the cursor is skipped).
* ``failed-load-safe``: a load that fails at any step (or on a full disk) leaves the
  broker's claim on its WAL; the next load recovers every acknowledged offset.
* ``one-writer``: a second host or WAL opener on an owner's directory is refused.
* ``fenced-refuses``: an owner that learned of a newer owner (a refused progress,
  upload or cursor write) acknowledges nothing more.
* ``cursor-monotonic``: a delayed older cursor write applied late never moves the
  stored cursor back.
* ``object-pinned``: an archived object replaced after its commit (another history, a
  stale owner on a store that ignores conditional puts) is never served: readers raise
  CorruptArchive and verify reports it.
* ``lm-move-completes``: a move the load manager's leader starts (rebalancing or a drain)
  ends with the topic owned, hosted where its placement says, within a bounded number of
  leader steps, also when the leader was lost in the middle (``tiered.tools.harness.lm``).
* ``lm-unowned-bound``: during a load-manager move the topic is unowned (sealed by its
  source, not loaded by its target) at the end of at most one round: the leader assigns
  the target in the step that first sees the release, also after a leader loss.
* ``lm-fenced``: once a new leader's term began, a write of the old term is refused.
* ``lm-measured-move``: a rebalancing move driven by measured traffic (the balanced or
  weighted_load strategy; topic counts point elsewhere) takes the topic to the broker
  with the least measured load, and never while rebalancing is paused.
* ``lm-load-report``: each broker's load report lists the topics it hosts with the
  bytes they received, per harness second.
* ``bystander-durable`` / ``bystander-unique``: the other topics of the same brokers (and WAL
  roots, commit groups, shared journals), written between the steps and moved now and then,
  keep every acknowledged message under its offset through every crash and power loss
  (``tiered.tools.harness.bystanders``).
* ``delete-complete`` / ``delete-refuses`` / ``recreate-continues`` / ``incarnation-isolation``:
  a topic deleted (by its sealing owner, past a paused or a dead owner, the deleter maybe
  dying mid-delete, a reader open across it) leaves nothing, refuses every access until
  re-created, and the new incarnation starts at an epoch above and an offset at or past
  what metadata knew of the old one; no message of a deleted incarnation is ever served
  again under the name (``tiered.tools.harness.incarnations``).
* ``retention-bounded`` / ``retention-resumes``: an archive retention cut moves the start
  exactly where its policy asks (never past it: no acknowledged message it did not ask
  for), offsets below it are ``OffsetBelowArchiveStart`` naming it, everything at or
  above it is served exactly once, and a cut a crash interrupted is finished by the next
  pass (``tiered.tools.harness.incarnations``).
* ``descriptors-contiguous`` (from the archive start) and ``verify-ok`` at the end of every
  scenario.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import native
from native import object_format
from tiered.lifecycle import BrokerHost, LoadError, TopicState
from tiered.lifecycle import host as host_module
from tiered.lifecycle.ownership import OwnershipLostError
from tiered.metadata import keys
from tiered.read.cloud import CloudReader
from tiered.archive.start import OffsetBelowArchiveStart
from tiered.read.errors import CorruptArchive, UnknownOffset
from tiered.read.reader import read_messages
from tiered.tools.harness import incarnations
from tiered.tools.harness.bystanders import Bystanders
from tiered.tools.harness.cluster import FAULTED_SEAL_DRAIN_S, WAIT_BOUND_S, Cluster, HarnessCrash
from tiered.tools.harness.model import TopicModel, Violation, check
from tiered.tools.harness.schedule import Step, make_schedule
from tiered.tools.harness.subproc import kill_broker_mid_produce
from tiered.tools.verify import verify_topic
from tiered.archive import last_committed_offset, list_descriptors
from tiered.archive.naming import descriptor_object_key
from uploader import collect_garbage
from wal import WriteAheadLog
from wal.errors import WalLocked
from wal.topics import TopicName

TOPIC = TopicName.parse("/harness/topic")


@dataclass
class ScenarioResult:
    seed: int
    schedule: list[Step]
    ok: bool
    violation: str | None = None
    failed_step: int | None = None
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    traceback: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "ok": self.ok, "violation": self.violation, "failed_step": self.failed_step,
                "schedule": [str(s) for s in self.schedule], "notes": self.notes,
                "elapsed_s": round(self.elapsed_s, 3)}


def run_scenario(seed: int, brokers: int = 3, steps: int = 12, metadata_url: str | None = None,
                 objects_url: str | None = None, subprocess_crashes: bool = False,
                 keep: bool = False) -> ScenarioResult:
    schedule = make_schedule(seed, brokers, steps, subprocess_crashes)
    root = tempfile.mkdtemp(prefix=f"dnb-harness-{seed}-")
    started = time.monotonic()
    result = ScenarioResult(seed, schedule, ok=True)
    try:
        # A quarter of the seeds run every broker on per-topic writers instead of the
        # default commit group with its journal: that path, and its share of the root's
        # memory budgets, goes through the same moves, crashes and faults.
        commit_group = seed % 4 != 3
        if not commit_group:
            result.notes.append("per-topic writers (wal.commit_group = false)")
        cluster = Cluster(root, brokers, TOPIC, *_urls(root, seed, metadata_url, objects_url), commit_group)
        scenario = Scenario(seed, cluster, result)
        try:
            scenario.run(schedule)
        finally:
            cluster.close()
    except Violation as v:
        result.ok, result.violation = False, str(v)
    except Exception as e:  # noqa: BLE001 - an unexpected error is a failed scenario, with its stack
        result.ok, result.violation = False, f"unexpected-error: {type(e).__name__}: {e}"
        result.traceback = traceback.format_exc()
    finally:
        result.elapsed_s = time.monotonic() - started
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return result


def _urls(root: str, seed: int, metadata_url: str | None, objects_url: str | None) -> tuple[str, str]:
    """Embedded stores per scenario; on real servers, a fresh etcd root / S3 prefix per seed."""
    tag = f"h{seed}-{os.getpid()}-{int(time.time() * 1000) % 10**9}"
    if metadata_url is None:
        metadata_url = f"sqlite:///{os.path.join(root, 'metadata.db').lstrip('/')}"
    elif metadata_url.startswith("etcd://"):
        metadata_url = metadata_url.rstrip("/") + ("/" if metadata_url.count("/") < 3 else "-") + tag
    if objects_url is None:
        objects_url = f"file://{os.path.join(root, 'objects')}"
        os.makedirs(os.path.join(root, "objects"), exist_ok=True)
    elif objects_url.startswith("s3://"):
        base, _, query = objects_url.partition("?")
        objects_url = base.rstrip("/") + "/" + tag + (f"?{query}" if query else "")
    return metadata_url, objects_url


@dataclass(frozen=True)
class Takeover:
    """What the checker knows about one failover: the LostRange it must end up with."""

    dead: int
    dead_epoch: int
    start: int  # where the new owner restarted numbering
    dead_tip: int | None  # the dead owner's durable tip (its WAL keeps exactly this)


class Scenario:
    def __init__(self, seed: int, cluster: Cluster, result: ScenarioResult) -> None:
        self.seed, self.cluster, self.result = seed, cluster, result
        self.model = TopicModel()
        self.owner = 0
        self.takeovers: list[Takeover] = []
        #: Brokers that died holding a WAL of the topic whose takeover record is gone (the
        #: incarnation was deleted): brought back at the end, they must record nothing.
        self.returning: list[int] = []
        #: Between the two halves of a move (sealed on the owner, not loaded yet).
        self.sealed = False
        self.sealed_at: int | None = None
        self._lm: Any = None
        #: Other topics on the same brokers (and WAL roots, commit groups, journals).
        self.bystanders = Bystanders(seed, cluster)

    def note(self, text: str) -> None:
        self.result.notes.append(text)

    def run(self, schedule: list[Step]) -> None:
        self.cluster.load(self.owner)
        for index, step in enumerate(schedule):
            self.result.failed_step = index
            self.bystanders.tick()
            getattr(self, f"step_{step.kind}")(step, index)
        self.result.failed_step = len(schedule)  # the final checks
        self.final_checks()
        self.bystanders.final_checks()
        self.result.failed_step = None

    def hosted(self) -> Any:
        return self.cluster.host(self.owner).topic(TOPIC)

    def other_broker(self, wanted: int) -> int:
        return wanted if wanted != self.owner else (self.owner + 1) % self.cluster.brokers

    # -- producing ----------------------------------------------------------------------
    def step_produce(self, step: Step, index: int) -> None:
        hosted = self.hosted()
        for _ in range(step.args["count"]):
            payload = self.model.next_payload(self.seed)
            offset = hosted.produce(payload, ack=step.args["ack"])
            self.model.appended(offset, payload)
            self.model.acked(offset, step.args["ack"])

    def step_produce_nowait(self, step: Step, index: int) -> None:
        hosted = self.hosted()
        for _ in range(step.args["count"]):
            payload = self.model.next_payload(self.seed)
            self.model.appended(hosted.append(payload), payload)

    # -- upload / consume ---------------------------------------------------------------
    def step_upload(self, step: Step, index: int) -> None:
        self.hosted().uploader.upload_once()
        self.check_descriptors()

    def step_consume(self, step: Step, index: int) -> None:
        name = step.args["subscription"]
        sub_model = self.model.subscriptions.setdefault(name, self.model.new_sub())
        hosted = self.hosted()
        sub = hosted.subscribe(name, "earliest")
        start = sub.cursor + 1
        check(start == sub_model.next_expected, "subscription-exactly-once",
              f"subscription {name} resumes at {start}, but its last acknowledged offset was "
              f"{sub_model.next_expected - 1} (or a takeover's restart point)")
        reader, start = self.resume_reader(hosted, name, start)
        got = read_messages(reader, step.args["max"])
        offsets = [m.offset for m in got]
        check(offsets == list(range(start, start + len(got))), "contiguous-offsets",
              f"subscription {name} from {start} read offsets {offsets}")
        for m in got:
            self.model.observed(m.offset, m.payload, f"consume {name}")
        if step.args["ack"] and got:
            sub.ack(got[-1].offset)
            sub.flush()
            sub_model.next_expected = got[-1].offset + 1
            again = [m.offset for m in got if m.payload in sub_model.acked_payloads]
            check(not again, "subscription-exactly-once",
                  f"subscription {name} acknowledged the messages at offsets {again} a second time")
            sub_model.acked_payloads.update(m.payload for m in got)

    def resume_reader(self, hosted: Any, name: str, start: int) -> tuple[Any, int]:
        """A reader at a subscription's resume point ``start``. Below the archive start
        (a retention cut passed the cursor) the read must be refused with
        OffsetBelowArchiveStart naming exactly the model's start, where the consumer
        then resumes: those offsets are gone by decision, not skipped."""
        try:
            reader = hosted.create_reader(start, live=False)
        except OffsetBelowArchiveStart as e:
            check(start < self.model.start and e.first_offset == self.model.start, "retention-bounded",
                  f"subscription {name} at {start}: refused as below the archive start {e.first_offset}, "
                  f"the model's start is {self.model.start}")
            self.note(f"subscription {name} at {start}: below the archive start, resumes at {self.model.start}")
            return hosted.create_reader(self.model.start, live=False), self.model.start
        except UnknownOffset as e:
            raise Violation("subscription-exactly-once", f"subscription {name} cannot resume at {start}: {e}") from e
        if start < self.model.start:
            reader.close()
            raise Violation("retention-bounded", f"subscription {name}: a reader at {start} was created, below "
                                                 f"the archive start {self.model.start}")
        return reader, start

    # -- moves and crashes --------------------------------------------------------------
    def step_move(self, step: Step, index: int) -> None:
        target = self.other_broker(step.args["to"])
        self.seal_for_move()
        self.load_after_seal(target)

    def seal_for_move(self) -> None:
        """The owner seals the topic (a move's first half)."""
        hosted = self.hosted()
        tip = hosted.next_offset - 1
        last = self.cluster.host(self.owner).unload(TOPIC)
        check(last == (None if tip < 0 else tip), "seal-continuity", f"seal returned {last}, WAL tip was {tip}")
        self.promote_pending(tip)
        self.sealed, self.sealed_at = True, last

    def load_after_seal(self, target: int) -> None:
        """Broker ``target`` loads the sealed topic (a move's second half)."""
        last = self.sealed_at
        self.sealed = False
        self.load_on(target)
        nxt = self.hosted().next_offset
        check(nxt == (0 if last is None else last + 1), "seal-continuity",
              f"sealed at {last}, but broker {target} starts at {nxt}")

    # -- delete / re-create and archive retention (tiered.tools.harness.incarnations) ----
    def step_delete_recreate(self, step: Step, index: int) -> None:
        incarnations.delete_recreate(self, step, index)

    def step_archive_retention(self, step: Step, index: int) -> None:
        incarnations.archive_retention(self, step, index)

    def check_below_start_refused(self, hosted: Any, where: str) -> None:
        incarnations.check_below_start_refused(self, hosted, where)

    # -- the load manager (tiered.tools.harness.lm) --------------------------------------
    def lm(self) -> Any:
        if self._lm is None:
            from tiered.tools.harness.lm import LoadManagerDriver

            self._lm = LoadManagerDriver(self)
        return self._lm

    def step_lm_move(self, step: Step, index: int) -> None:
        self.lm().rebalance_step(index, step.args["to"], step.args["leader_loss"], step.args["strategy"],
                                 step.args["mb_s"])

    def step_lm_drain(self, step: Step, index: int) -> None:
        self.lm().drain_step(index, step.args["leader_loss"])

    def promote_pending(self, tip: int) -> None:
        """After a flush + seal everything appended up to the tip is durable."""
        for offset in [o for o in self.model.pending if o <= tip]:
            self.model.acked(offset, "durable")

    def load_on(self, target: int) -> Any:
        self.owner = target
        return self.cluster.load(target)

    def step_restart(self, step: Step, index: int) -> None:
        self.cluster.crash(self.owner)
        self.reload_same_broker("restart")

    def step_power_loss(self, step: Step, index: int) -> None:
        self.cluster.power_loss(self.owner, step.args["torn_bytes"])
        self.reload_same_broker("power loss")

    def reload_same_broker(self, why: str) -> None:
        hosted = self.load_on(self.owner)
        nxt = hosted.next_offset
        durable_top = max(self.model.durable_acked, default=-1)
        check(nxt > durable_top, "durable-readable",
              f"after a {why}, broker {self.owner} continues at {nxt}, below acknowledged offset {durable_top}")
        check(nxt >= self.model.top(), "unique-offsets",
              f"after a {why}, broker {self.owner} continues at {nxt}, reusing offsets up to {self.model.top() - 1}")
        self.model.forget_unsynced(nxt)

    def step_takeover(self, step: Step, index: int, keep_dead_running: bool = False) -> None:
        dead, target = self.owner, self.other_broker(step.args["to"])
        dead_hosted = self.hosted()
        # The process dies unsealed; its disk stays (the broker comes back later). Closing
        # drains what was appended, so the WAL on that disk ends exactly at this tip.
        # (A stale owner keeps running; every append it made is already durable.)
        if keep_dead_running:
            dead_hosted.wal.flush(WAIT_BOUND_S)
        else:
            self.cluster.crash(dead)
        dead_tip = _durable_tip(dead_hosted)
        archive_end = last_committed_offset(self.cluster.inner_metadata, TOPIC)
        # Nothing archived in this incarnation: numbering restarts where it began.
        first_new = self.model.incarnation_first if archive_end is None else archive_end + 1
        cursors_before = {n: s.next_expected - 1 for n, s in self.model.subscriptions.items()}
        hosted = self.load_on(target)
        check(hosted.next_offset == first_new, "takeover-start",
              f"broker {target} took over at {hosted.next_offset}, but the archive ends at {archive_end}")
        actual_tail = 0 if dead_tip is None else max(0, dead_tip - first_new + 1)
        reported = hosted.report.unarchived_at_least
        check(reported <= actual_tail, "takeover-report",
              f"reported {reported} unarchived offsets, but only {actual_tail} were past the archive")
        lost = self.model.reassign_tail(first_new, archive_end)
        check(not lost or (dead_tip is not None and lost[-1] <= dead_tip), "lost-range-exact",
              f"offsets {lost} were lost, but the dead owner's WAL ended at {dead_tip}")
        self.check_cursors_clamped(hosted, first_new, cursors_before)
        self.takeovers.append(Takeover(dead, dead_hosted.token.epoch, first_new, dead_tip))
        self.note(f"step {index}: takeover by b{target} at {first_new}; lost tail {len(lost)} "
                  f"(reported at least {reported}, dead tip {dead_tip})")

    # -- the single-fault kinds of the loss paths (docs/SAFETY.md) ---------------------
    def step_failed_load(self, step: Step, index: int) -> None:
        self.cluster.crash(self.owner)
        host = self.cluster.host(self.owner)
        target = {"open WAL": "_open_wal", "mark topic open": "_mark_open",
                  "clamp subscription cursors": None, "start uploader": "_start_uploader",
                  "open subscriptions": "_open_subscriptions"}[step.args["step"]]
        if target is None:
            original = host_module.clamp_cursors
            host_module.clamp_cursors = _raising(OSError("injected failure while clamping"))
        else:
            original = getattr(host, target)
            setattr(host, target, _raising(OSError(f"injected failure at {step.args['step']}")))
        try:
            host.load(self.cluster.topic)
            raise Violation("failed-load-safe", f"load with a failing {step.args['step']!r} step succeeded")
        except LoadError as e:
            check(e.step == step.args["step"], "failed-load-safe", f"load failed at {e.step!r}, injected at "
                  f"{step.args['step']!r}")
        finally:
            if target is None:
                host_module.clamp_cursors = original
            else:
                delattr(host, target)  # the instance attribute shadowed the method
        self.reload_same_broker(f"load that failed at {step.args['step']!r}")

    def step_disk_full_load(self, step: Step, index: int) -> None:
        fs = self.cluster.fs[self.owner]
        if fs is None:  # the real-disk broker cannot be filled on purpose: a plain restart
            self.step_restart(step, index)
            return
        self.cluster.crash(self.owner)
        fs.disk_full = True
        try:
            for _ in range(step.args["attempts"]):
                try:
                    self.cluster.load(self.owner)
                    raise Violation("failed-load-safe", "a load on a full disk succeeded")
                except Violation:
                    raise
                except Exception as e:  # noqa: BLE001 - any typed failure; what it leaves is checked
                    self.note(f"step {index}: load on a full disk failed: {type(e).__name__}")
        finally:
            fs.disk_full = False
        self.reload_same_broker("disk full at load")

    def step_second_opener(self, step: Step, index: int) -> None:
        fs = self.cluster.fs[self.owner]
        for who, open_it in (
            ("a second broker host", lambda: BrokerHost(self.cluster.broker_id(self.owner), self.cluster.wal_root(self.owner),
                                                         self.cluster.metadata, self.cluster.objects, self.cluster.config,
                                                         wal_fs=fs)),
            ("a second WAL opener", lambda: WriteAheadLog.open(self.cluster.wal_root(self.owner), str(self.cluster.topic),
                                                               fs=fs)),
        ):
            try:
                opened = open_it()
            except WalLocked:
                continue
            opened.close()
            raise Violation("one-writer", f"{who} opened broker b{self.owner}'s directory while it hosts the topic")
        self.step_produce(Step("produce", {"count": 1, "ack": "durable"}), index)  # the owner is unharmed

    def step_stale_owner(self, step: Step, index: int) -> None:
        """Another broker takes over while the owner still runs (its lease lapsed while it
        was paused, or an operator forced it). Once the old owner learns it from one
        refused write, it must refuse to acknowledge anything."""
        old = self.owner
        old_hosted = self.hosted()
        self.step_takeover(Step("takeover", {"to": step.args["to"]}), index, keep_dead_running=True)
        how = step.args["learns_by"]
        if step.args.get("store_ignores_if_none_match"):
            # The new owner archives first; then the stale owner uploads its own tail for
            # the same offsets through a store that lets every put overwrite.
            self.step_produce(Step("produce", {"count": 2, "ack": "archived"}), index)
            self.cluster.objects.ignore_conditional_put = True
            how = "upload"
        try:
            incarnations.stale_owner_learns(old_hosted, how, lambda text: self.note(f"step {index}: {text}"),
                                            f"old owner b{old}", f"b{self.owner} took it over")
        finally:
            self.cluster.objects.ignore_conditional_put = False
        try:
            offset = old_hosted.produce(b"stale")
        except OwnershipLostError:
            pass
        else:
            raise Violation("fenced-refuses", f"fenced broker b{old} acknowledged offset {offset}")
        self.cluster.crash(old)

    def step_delayed_write(self, step: Step, index: int) -> None:
        name = step.args["subscription"]
        sub_model = self.model.subscriptions.setdefault(name, self.model.new_sub())
        hosted = self.hosted()
        sub = hosted.subscribe(name, "earliest")
        reader, _start = self.resume_reader(hosted, name, sub.cursor + 1)
        got = read_messages(reader, step.args["max"])
        if len(got) < 2:
            return
        for m in got:
            self.model.observed(m.offset, m.payload, f"consume {name}")
        sub.ack(got[0].offset)
        self.cluster.metadata_faults.delay_write("txn")
        try:
            sub.flush()
        except Exception as e:  # noqa: BLE001 - the write "timed out"; its fate is decided later
            self.note(f"step {index}: cursor write held back ({type(e).__name__})")
        sub.ack(got[-1].offset)
        sub.flush()
        self.cluster.metadata_faults.apply_delayed()  # the held write lands now, late
        self.cluster.clear_faults()
        kv = self.cluster.inner_metadata.get(keys.cursor_key(TOPIC, name))
        stored = keys.Cursor.from_json(kv.key, kv.value).last_acked_offset
        check(stored == got[-1].offset, "cursor-monotonic",
              f"subscription {name}: acknowledged through {got[-1].offset}, stored cursor is {stored}")
        again = [m.offset for m in got if m.payload in sub_model.acked_payloads]
        check(not again, "subscription-exactly-once",
              f"subscription {name} acknowledged the messages at offsets {again} a second time")
        sub_model.acked_payloads.update(m.payload for m in got)
        sub_model.next_expected = got[-1].offset + 1

    def step_impostor(self, step: Step, index: int) -> None:
        """Replace one committed object with other bytes of the same size; nothing may
        serve them, and verify must say so. Then put the real object back."""
        # Descriptors wholly below the archive start (a cut's leftovers) are never read.
        descriptors = [d for d in list_descriptors(self.cluster.inner_metadata, TOPIC)
                       if d.end_offset >= self.model.start]
        if not descriptors:
            return
        d = descriptors[int(step.args["which"] * len(descriptors))]
        key = descriptor_object_key(TOPIC, d)
        real = self.cluster.inner_objects.get(key)
        self.cluster.inner_objects.put(key, _other_history(real, key, self.cluster.config.uploader))
        try:
            try:
                with CloudReader(TOPIC, self.cluster.inner_metadata, self.cluster.inner_objects,
                                 d.start_offset, d.end_offset) as reader:
                    served = [(m.offset, m.payload) for m in reader]
            except CorruptArchive:
                pass
            else:
                raise Violation("object-pinned", f"object {key} was replaced, yet a read served {len(served)} "
                                                 "messages from it")
            report = verify_topic(TOPIC, self.cluster.inner_metadata, self.cluster.inner_objects)
            check(not report.ok, "object-pinned", f"verify says ok with {key} replaced")
        finally:
            self.cluster.inner_objects.put(key, real)

    def check_cursors_clamped(self, hosted: Any, start: int, before: dict[str, int]) -> None:
        expected = {n: c for n, c in before.items() if c >= start}
        check(hosted.report.clamped_cursors == expected, "cursor-clamp",
              f"load at {start} reported clamps {hosted.report.clamped_cursors}, expected {expected}")
        for name, sub in self.model.subscriptions.items():
            kv = self.cluster.inner_metadata.get(keys.cursor_key(TOPIC, name))
            stored = None if kv is None else keys.Cursor.from_json(kv.key, kv.value).last_acked_offset
            want = sub.next_expected - 1  # -1: pinned before offset 0 (subscribe always pins)
            check(stored == want, "cursor-clamp",
                  f"after a takeover at {start}, subscription {name}'s cursor is {stored}, expected {want}")

    def check_lost_ranges(self) -> None:
        """Bring every dead broker back (its host retires its stale WAL), then the lost
        ranges must be exactly the takeovers' tails: reported, exact, nothing else."""
        for dead in [t.dead for t in self.takeovers] + self.returning:
            self.cluster.host(dead)
        records = {(r.start_offset, r.epoch): r for r in keys.read_lost_ranges(self.cluster.inner_metadata, TOPIC)}
        expected = {(t.start, t.dead_epoch): t for t in self.takeovers}
        check(set(records) == set(expected), "lost-range-exact",
              f"lost-range records at (start, epoch) {sorted(records)}, takeovers {sorted(expected)}")
        for at, takeover in expected.items():
            record = records[at]
            tip = takeover.dead_tip
            end = tip if tip is not None and tip >= takeover.start else None
            check(record.exact and record.broker_id == self.cluster.broker_id(takeover.dead)
                  and record.end_offset == end and (record.quarantine_path is not None) == (end is not None),
                  "lost-range-exact",
                  f"takeover at {takeover.start} from b{takeover.dead} (epoch {takeover.dead_epoch}, WAL tip {tip}) "
                  f"is recorded as {record}")

    def step_uploader_crash(self, step: Step, index: int) -> None:
        self.cluster.crash_hook.arm(step.args["point"])
        try:
            self.hosted().uploader.upload_once()
        except HarnessCrash:
            pass
        except Exception as e:  # noqa: BLE001 - the hook may surface wrapped; the crash follows anyway
            if not self.cluster.crash_hook.fired:
                raise
            self.note(f"step {index}: uploader crash surfaced as {type(e).__name__}")
        fired = self.cluster.crash_hook.fired
        self.cluster.crash_hook.armed = None
        if fired:
            self.cluster.crash(self.owner)
            self.reload_same_broker(f"crash at uploader step {step.args['point']}")

    def step_s3_fault(self, step: Step, index: int) -> None:
        plan = self.cluster.object_faults
        plan.fail(step.args["op"], times=1 if step.args["transient"] else None)
        self.faulted(step, index)

    def step_etcd_fault(self, step: Step, index: int) -> None:
        plan = self.cluster.metadata_faults
        plan.fail(step.args["op"], times=1 if step.args["transient"] else None, when=step.args["when"])
        self.faulted(step, index)

    def faulted(self, step: Step, index: int) -> None:
        """Run an upload or a seal under the armed fault, then retry with storage healthy."""
        if step.args["during"] == "upload":
            try:
                self.hosted().uploader.upload_once()
            except Exception as e:  # noqa: BLE001 - failing is allowed; retrying must then work
                self.note(f"step {index}: upload under fault failed: {type(e).__name__}")
            self.cluster.clear_faults()
            self.recover_uploader(index)
            return
        self.faulted_seal(index, heals=step.args["transient"])

    def recover_uploader(self, index: int) -> None:
        """A fatal uploader error (e.g. a storage error it does not retry) stops it for
        good; a broker then restarts the topic. Either way the next pass must work."""
        hosted = self.hosted()
        if hosted.uploader.failed is not None:
            self.note(f"step {index}: uploader stopped ({type(hosted.uploader.failed).__name__}); restarting broker")
            self.cluster.crash(self.owner)
            self.reload_same_broker("uploader failure")
        self.hosted().uploader.upload_once()
        self.check_descriptors()

    def faulted_seal(self, index: int, heals: bool = True) -> None:
        """Seal under the armed fault. A fault that ``heals`` (fails once) is ridden out
        within the usual generous bound; one that stays fails the seal whatever its drain
        bound (it is cleared only afterwards), so that seal gets a short one."""
        host, hosted = self.cluster.host(self.owner), self.hosted()
        tip = hosted.next_offset - 1
        if not heals:
            config = host.config
            host.config = dataclasses.replace(config, uploader=dataclasses.replace(
                config.uploader, drain_timeout_s=FAULTED_SEAL_DRAIN_S))
        try:
            try:
                last = host.unload(TOPIC)
            finally:
                host.config = self.cluster.config
        except Exception as e:  # noqa: BLE001 - the failure is allowed; what it leaves is checked
            self.note(f"step {index}: seal under fault failed: {type(e).__name__}: {str(e)[:80]}")
            self.cluster.clear_faults()
            self.check_unload_left_safe(hosted, TopicState)
            last = host.unload(TOPIC)
        self.cluster.clear_faults()
        check(last == (None if tip < 0 else tip), "seal-continuity", f"seal returned {last}, WAL tip was {tip}")
        self.promote_pending(tip)
        hosted = self.load_on(self.owner)  # the same broker loads it again from the seal
        check(hosted.next_offset == tip + 1, "seal-continuity",
              f"sealed at {last}, reloaded at {hosted.next_offset}")

    def check_unload_left_safe(self, hosted: Any, topic_state: Any) -> None:
        state_kv = self.cluster.inner_metadata.get(keys.state_key(TOPIC))
        sealed = state_kv is not None and keys.SealedState.from_json(state_kv.key, state_kv.value).sealed
        if hosted.state is topic_state.SEALED:
            return  # the seal landed; only local cleanup failed, and unload resumes it
        check(not sealed, "unload-failure-safe", "a failed unload left the topic sealed")
        check(not hosted.wal.closed, "unload-failure-safe", "a failed unload closed the WAL")

    def step_sigkill(self, step: Step, index: int) -> None:
        target = self.cluster.brokers  # the real-disk broker
        last = self.cluster.host(self.owner).unload(TOPIC)
        self.promote_pending(-1 if last is None else last)
        self.cluster.crash(self.owner)
        # The real-disk broker's in-process host may still run (the topic moved off it by a
        # move or a load-manager step): the worker is that broker, and its host must be the
        # only opener of the WAL root (else the worker is refused, rightly, and dies unheard).
        self.cluster.crash(target)
        reported = kill_broker_mid_produce(self, target, step.args["count"], step.args["after_s"])
        self.owner = target
        hosted = self.cluster.load(target)
        self.note(f"step {index}: SIGKILLed broker b{target} after {len(reported)} durable acks; "
                  f"recovered to {hosted.next_offset}")
        for offset, payload in reported:
            self.model.appended(offset, payload)
            self.model.acked(offset, "durable")
        check(hosted.report.recovered_local_wal, "durable-readable", "the killed broker did not recover its WAL")
        self.adopt_unreported(hosted)
        self.reload_same_broker("SIGKILL")

    def adopt_unreported(self, hosted: Any) -> None:
        """Messages the killed broker made durable but did not get to report are real: read
        them once so the model knows them (they must be the worker's payloads, in order)."""
        top = max(self.model.top(), self.model.start)
        for m in read_messages(hosted.create_reader(top, live=False), None):
            check(m.payload.startswith(f"seed{self.seed}-k".encode()), "unique-offsets",
                  f"offset {m.offset} after a SIGKILL holds unexpected {m.payload!r}")
            self.model.appended(m.offset, m.payload)
            self.model.observed(m.offset, m.payload, "after SIGKILL")

    # -- checks -------------------------------------------------------------------------
    def check_descriptors(self) -> None:
        """The retained chain (descriptors not wholly below the archive start: those are a
        cut's leftovers) starts at the model's start and has no gap or overlap."""
        descriptors = [d for d in list_descriptors(self.cluster.inner_metadata, TOPIC)
                       if d.end_offset >= self.model.start]
        expected = self.model.start
        for d in descriptors:
            check(d.start_offset == expected, "descriptors-contiguous",
                  f"descriptor {d.start_offset}-{d.end_offset} follows one ending at {expected - 1}")
            expected = d.end_offset + 1

    def final_checks(self) -> None:
        self.cluster.clear_faults()
        hosted = self.hosted()
        # Unacknowledged appends of the last steps become readable once fsynced: readers
        # only ever see durable offsets, so flush before comparing against the tip.
        hosted.wal.flush(WAIT_BOUND_S)
        hosted.uploader.upload_once()
        tip = hosted.next_offset
        first = self.model.start
        got = read_messages(hosted.create_reader("earliest", live=False), None)
        offsets = [m.offset for m in got]
        check(offsets == list(range(first, tip)), "contiguous-offsets",
              f"a full read yields {_ranges(offsets)}, expected {first}-{tip - 1}")
        self.check_below_start_refused(hosted, "the final read")
        for m in got:
            self.model.observed(m.offset, m.payload, "final read")
        missing = sorted(o for o in self.model.durable_acked if o >= tip)
        check(not missing, "durable-readable", f"acknowledged offsets {missing} are gone (tip {tip})")
        self.check_descriptors()
        self.check_lost_ranges()
        collect_garbage(self.cluster.inner_metadata, self.cluster.inner_objects, TOPIC, grace_s=0.0)
        report = verify_topic(TOPIC, self.cluster.inner_metadata, self.cluster.inner_objects,
                              wal_dir=self.cluster.local_wal_dir(self.owner))
        check(report.ok, "verify-ok", "; ".join(p["message"] for p in report.problems))


def _other_history(real: bytes, key: str, config: Any) -> bytes:
    """A valid object of the same topic, offsets, publish times and sizes as ``real``,
    but other payload bytes: what a stale owner's upload of the same range looks like.
    Only the descriptor's digest tells the two apart (format CRCs all hold)."""
    records = object_format.read_records(real, key)
    batch = [(r.publish_time, r.key, r.attributes, bytes(b ^ 0x20 for b in r.payload)) for r in records]
    first = records[0].offset
    level = config.zstd_level if config.compression == "zstd" else 0
    return object_format.write_object(native.encode_batch(first, batch), topic=str(TOPIC),
                                      block_bytes=config.block_bytes, zstd_level=level)


def _raising(error: BaseException) -> Any:
    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise error
    return fail


def _durable_tip(hosted: Any) -> int | None:
    durable = hosted.wal.durable_offset
    return None if durable is None or durable < 0 else durable


def _ranges(offsets: list[int]) -> str:
    if not offsets:
        return "nothing"
    spans, start, prev = [], offsets[0], offsets[0]
    for o in offsets[1:]:
        if o != prev + 1:
            spans.append(f"{start}-{prev}")
            start = o
        prev = o
    spans.append(f"{start}-{prev}")
    return ", ".join(spans)
