"""The load manager inside the harness: moves it decides, leader loss mid-move, drains.

The harness's brokers follow no assignment watcher and hold no session (the harness
decides who is dead), so a load-manager step stages a small cluster around the one
real topic and plays the parts the harness owns, synchronously and deterministically:

* **Registrations and load reports.** While the step runs, every live broker is
  registered (``/cluster/registered/b<i>``, no lease) and reports its load: the real
  topic's numbers come from :class:`~tiered.cluster.reports.LoadReporter` on its owner.
  Both are removed when the step ends, so the other steps (a takeover needs the dead
  owner unregistered) see the world they always saw.
* **Where the topic is.** Other steps move the topic by hand (seal here, load there),
  like an operator. Before deciding, the harness records that the way an operator's
  ``dnb move`` does: the topic's only assignment names its owner, and the leader adopts
  it (the placement record follows; nothing else is rewritten).
* **Imbalance by load.** Blacklisted ballast topics (no data: placement records and
  assignments only) give the owner's broker the most topics and the step's target the
  fewest, under the Fair strategy: the leader's rebalancing check then finds the real
  topic the one move that lowers the CV. Ballast is fixture state: it is rewritten at
  every step and never hosted.
* **The assignment watcher.** After each leader step the harness does what a watcher
  does: the owner seals when its assignment is gone, the assignee loads once the topic
  is released. Every seal and load goes through the harness's usual continuity checks.

**Time.** Nothing here reads the machine's clock, so a seed plays out the same on a fast
and on a loaded machine. The load manager, its load reports and its election all run
on the harness clock (:meth:`LoadManagerDriver.clock`: one second per round, still
between rounds); the election's lease is refreshed at every round, and it is granted
for ``LEADER_TTL_S``: a day, in harness seconds for the election's own certainty and in
real seconds for the store's countdown, far longer than any scenario lasts (a few
hundred rounds at most). So a term ends only where the schedule says.

Leader loss is the old leader's lease ending (revoked: what its expiry looks like to the
store) between two steps of a move, at the step the schedule names; a new leader
reconciles from stored state and finishes the move. The stale leader's token is then
used for one more write, which the fence must refuse (``lm-fenced``). A move the leader
does not finish within the round bound is ``lm-move-completes``.
"""
from __future__ import annotations

import json
from typing import Any

from tiered.cluster import admin, records
from tiered.cluster.config import FailoverConfig, LoadManagerConfig, RebalancingConfig, Strategy
from tiered.cluster.leader import LeaderElection
from tiered.cluster.observe import read_snapshot
from tiered.cluster.reports import LoadReporter
from tiered.cluster.runtime import Executor, Fenced, LoadManager, RuntimeConfig
from tiered.lifecycle.ownership import registered_key
from tiered.metadata import keys
from tiered.metadata.base import Delete, Put
from tiered.tools.harness.model import Violation, check

BALLAST_NS = "/harness-ballast/"
#: Rounds (leader step + watcher) a step may take before its move counts as stuck.
ROUNDS_MAX = 40
#: Where a leader loss may be injected in the middle of a move.
LEADER_LOSS_POINTS = ("released", "transfer", "assign")

LM_CONFIG = LoadManagerConfig(
    assignment_strategy=Strategy.FAIR,
    load_report_interval_s=1.0,
    assign_timeout_s=1e9,  # the harness's watcher never loses an assignment
    failover=FailoverConfig(grace_s=0.0, grace_unstable_s=0.0, stable_after_s=0.0),
    rebalancing=RebalancingConfig(enabled=True, check_interval_s=0.5, max_moves_per_hour=10_000, cooldown_s=0.0,
                                  min_topic_age_s=0.0, hit_count=1, settle_delay_s=0.0, cv_threshold=0.1,
                                  pingpong_window_s=0.0, blacklist_topics=(BALLAST_NS + "*",)),
)
#: The leader lease: a day (see "Time" in the module docstring). Only an explicit
#: leader-loss step ends a term, never a slow machine.
LEADER_TTL_S = 86_400.0
LM_RUNTIME = RuntimeConfig(leader_ttl_s=LEADER_TTL_S)


class LoadManagerDriver:
    """One scenario's load manager: leader(s), clock, staging (see the module docstring)."""

    def __init__(self, scenario: Any) -> None:
        self.scenario = scenario
        self.cluster = scenario.cluster
        self.metadata = self.cluster.inner_metadata
        self.topic = str(self.cluster.topic)
        self.now = 1_000_000.0
        self.leaders = 0
        self.lm: LoadManager | None = None
        self.reporters: dict[int, LoadReporter] = {}
        self.last_skipped: tuple[str, ...] = ()
        #: broker id → the ballast topics staged on it (as load-report entries).
        self.ballast_of: dict[str, list[dict]] = {}
        self.loss_pending: str | None = None
        self.step_index = 0

    def clock(self) -> float:
        return self.now

    # -- leaders -----------------------------------------------------------------------
    def _leader(self) -> LoadManager:
        if self.lm is None:
            self.leaders += 1
            node = f"lm-{self.leaders}"
            election = LeaderElection(self.metadata, node, LM_RUNTIME.leader_ttl_s, clock=self.clock,
                                      wall_clock=self.clock)
            self.lm = LoadManager(self.metadata, node, LM_CONFIG, LM_RUNTIME, election=election, clock=self.clock)
            election.tick()
            check(election.is_leader(), "lm-leader", f"{node} did not win a vacant election")
        return self.lm

    def lose_leader(self, index: int, point: str) -> None:
        """The leader's lease ends mid-move; a new leader takes over; the old term's
        writes are refused."""
        old = self._leader()
        token = old.election.current()
        old.election.resign()  # its lease is gone, as when it expires
        self.lm = None
        new = self._leader()
        new_token = new.election.current()
        assert token is not None and new_token is not None
        check(new_token.term != token.term, "lm-fenced", "the new leader has the old leader's term")
        probe = "/harness/stale-leader-probe"
        try:
            landed = Executor(self.metadata, self.clock).txn(token, [], [Put(probe, b"stale")])
        except Fenced:
            landed = False
        check(not landed and self.metadata.get(probe) is None, "lm-fenced",
              f"a write of the old leader's term {token.term} landed after term {new_token.term} began")
        self.scenario.note(f"step {index}: leader lost at {point}; lm-{self.leaders} leads a new term, "
                           "the old term's write was refused")

    # -- staging -----------------------------------------------------------------------
    def live(self) -> list[int]:
        """The brokers the leader may use: every fault-injected broker (a crashed one is
        back as soon as it loads something, as in a move step) and the owner."""
        return sorted(set(range(self.cluster.brokers)) | {self.scenario.owner})

    def stage(self, ballast: dict[int, int]) -> None:
        """Registrations, the real topic's assignment as it really is, ballast, reports."""
        ops: list[Any] = []
        snap = read_snapshot(self.metadata)
        live = self.live()
        for i in live:
            body = json.dumps({"broker_id": self.cluster.broker_id(i), "address": None}).encode()
            ops.append(Put(registered_key(self.cluster.broker_id(i)), body))
        owner = self.cluster.broker_id(self.scenario.owner)
        for broker in snap.assignments.get(self.topic, {}):
            if broker != owner:
                ops.append(Delete(keys.assignment_key(broker, self.topic)))
        if owner not in snap.assignments.get(self.topic, {}):
            ops.append(Put(keys.assignment_key(owner, self.topic), keys.Assignment(self.now, "harness").to_json()))
        wanted: dict[str, bytes] = {}
        n = 0
        for i, count in sorted(ballast.items()):
            broker = self.cluster.broker_id(i)
            for _ in range(count):
                topic = f"{BALLAST_NS}t{n}"
                n += 1
                placement = records.PlacementRecord("owned", broker, 0.0, self.now, reason="harness ballast")
                wanted[records.placement_key(topic)] = records.encode(placement)
                wanted[keys.assignment_key(broker, topic)] = keys.Assignment(self.now, "ballast").to_json()
        old = [keys.assignment_key(b, t) for t, brokers in snap.assignments.items() if t.startswith(BALLAST_NS)
               for b in brokers]
        old += [records.placement_key(t) for t in snap.placements if t.startswith(BALLAST_NS)]
        old += [keys.unassigned_key(t) for t in snap.markers if t.startswith(BALLAST_NS)]
        self.ballast_of = {}
        for key, value in wanted.items():
            if key.startswith(keys.ASSIGNMENTS_PREFIX):
                broker, _, rest = key[len(keys.ASSIGNMENTS_PREFIX):].partition("/")
                self.ballast_of.setdefault(broker, []).append({"topic": "/" + rest})
        ops += [Delete(k) for k in sorted(set(old) - set(wanted))]
        ops += [Put(k, v) for k, v in sorted(wanted.items())]
        self.metadata.txn([], ops)
        self.report()

    def report(self) -> None:
        ops = []
        for i in self.live():
            host = self.cluster.hosts[i]
            if host is None:  # not running now: an empty report (it hosts nothing)
                record = records.LoadReportRecord(self.cluster.broker_id(i), 0, self.now)
            else:
                reporter = self.reporters.get(i)
                if reporter is None or reporter.host is not host:
                    reporter = self.reporters[i] = LoadReporter(host, interval_s=3600.0, clock=self.clock)
                record = reporter.build()
            ballast = self.ballast_of.get(self.cluster.broker_id(i), [])
            record = records.LoadReportRecord(record.broker_id, record.seq, self.now, record.cpu_pct,
                                              record.mem_pct, record.cpu_cores, record.mem_bytes,
                                              record.net_in_bps, record.net_out_bps, record.topics + ballast)
            ops.append(Put(records.load_key(record.broker_id), records.encode(record)))
        self.metadata.txn([], ops)

    def unstage(self) -> None:
        ops: list[Any] = [Delete(registered_key(self.cluster.broker_id(i))) for i in range(len(self.cluster.hosts))]
        ops += [Delete(records.load_key(self.cluster.broker_id(i))) for i in range(len(self.cluster.hosts))]
        self.metadata.txn([], ops)

    # -- running -----------------------------------------------------------------------
    def placement(self) -> records.PlacementRecord | None:
        kv = self.metadata.get(records.placement_key(self.topic))
        return None if kv is None else records.decode(records.PlacementRecord, kv.key, kv.value)

    def round(self) -> bool:
        """One leader step, then the watcher's part; True if anything happened."""
        self.now += 1.0
        self.report()
        lm = self._leader()
        lm.election.tick()  # refresh, as the election thread would (harness time: see the docstring)
        check(lm.election.is_leader(), "lm-leader", f"{lm.node_id} lost its lease without a leader-loss step")
        report = lm.step()
        check(not report.fenced, "lm-fenced", "the only leader's write was refused by its own fence")
        if report.decision is not None and report.decision.checked:
            self.last_skipped = tuple(report.decision.skipped)
        self._maybe_lose_leader()
        watched = self.watch()
        self._maybe_lose_leader()
        return bool(report.applied or report.observed) | watched

    def _maybe_lose_leader(self) -> None:
        if self.loss_pending is None:
            return
        p = self.placement()
        if p is not None and self._reached(p, self.loss_pending):
            point, self.loss_pending = self.loss_pending, None
            self.lose_leader(self.step_index, point)

    def watch(self) -> bool:
        """What the owner's and the assignee's assignment watchers would do now."""
        assigned = {b for b in map(self.cluster.broker_id, self.live())
                    if self.metadata.get(keys.assignment_key(b, self.topic)) is not None}
        owner_id = self.cluster.broker_id(self.scenario.owner)
        host = self.cluster.hosts[self.scenario.owner]
        hosted = host.topics() if host is not None else []
        if owner_id not in assigned and any(str(h.topic) == self.topic for h in hosted):
            self.scenario.seal_for_move()
            return True
        if len(assigned) == 1 and owner_id not in assigned and self.scenario.sealed:
            [target] = assigned
            self.scenario.load_after_seal(int(target[1:]))
            return True
        return False

    def run_move(self, index: int, leader_loss: str | None, what: str) -> None:
        """Rounds until the topic moved and the leader is idle again; inject the leader
        loss once the move reaches ``leader_loss``."""
        start_owner = self.scenario.owner
        self.loss_pending, self.step_index = leader_loss, index
        self.last_skipped = ()
        for _ in range(ROUNDS_MAX):
            busy = self.round()
            p = self.placement()
            settled = not busy and not self.scenario.sealed and p is not None and p.state == "owned"
            if settled and self.scenario.owner != start_owner:
                break
        else:
            self.loss_pending = None
            raise Violation("lm-move-completes", f"{what}: not done after {ROUNDS_MAX} rounds (placement "
                                                 f"{self.placement()}, hosted on b{self.scenario.owner}, last "
                                                 f"check skipped {self.last_skipped})")
        check(self.loss_pending is None, "lm-move-completes", f"{what}: the move never reached {self.loss_pending}")
        p = self.placement()
        check(p is not None and p.state == "owned" and p.broker == self.cluster.broker_id(self.scenario.owner),
              "lm-move-completes", f"{what}: placement {p} but the topic is hosted on b{self.scenario.owner}")

    def _reached(self, p: records.PlacementRecord, point: str | None) -> bool:
        if point == "transfer":
            return p.state == "releasing" and not self.scenario.sealed
        if point == "released":
            return p.state == "releasing" and self.scenario.sealed
        if point == "assign":
            return p.state == "assigning" and p.kind is not None and self.scenario.sealed
        return False

    # -- the step kinds ------------------------------------------------------------------
    def rebalance_step(self, index: int, to: int, leader_loss: str | None) -> None:
        live = self.live()
        owner = self.scenario.owner
        target = to if to in live and to != owner else next((i for i in live if i != owner), None)
        if target is None:
            return
        # Owner: the topic + 2 ballast; target: none; every other live broker: 1.
        ballast = {i: (2 if i == owner else 0 if i == target else 1) for i in live}
        self.stage(ballast)
        try:
            self.run_move(index, leader_loss, "a load-manager rebalancing move")
            check(self.scenario.owner == target, "lm-move-completes",
                  f"the leader did not move the topic from b{owner} to the least loaded b{target} "
                  f"(it is on b{self.scenario.owner})")
            kinds = [h["kind"] for h in admin.history(self.metadata, self.topic)["history"]]
            check(kinds[-1:] == ["auto"], "lm-move-completes", f"the move's history is {kinds}")
        finally:
            self.unstage()

    def drain_step(self, index: int, leader_loss: str | None) -> None:
        live = self.live()
        owner = self.scenario.owner
        if len(live) < 2:
            return
        broker = self.cluster.broker_id(owner)
        self.stage({})
        try:
            admin.set_mode(self.metadata, broker, "draining", by="harness")
            self.run_move(index, leader_loss, f"draining b{owner}")
            for _ in range(ROUNDS_MAX):  # the leader marks it drained once nothing is left
                self.round()
                mode = read_snapshot(self.metadata).modes.get(broker)
                if mode is not None and mode[0].mode == "drained":
                    break
            else:
                raise Violation("lm-move-completes", f"b{owner} never became drained")
        finally:
            admin.set_mode(self.metadata, broker, "active", by="harness")  # undrain
            self.unstage()
