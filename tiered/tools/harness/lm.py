"""The load manager inside the harness: moves it decides, leader loss mid-move, drains.

The harness's brokers follow no assignment watcher and hold no session (the harness
decides who is dead), so a load-manager step stages a small cluster around the one
real topic and plays the parts the harness owns, synchronously and deterministically:

* **Registrations and load reports.** While the step runs, every live broker is
  registered (``/cluster/registered/b<i>``, no lease) and reports its load, built by a
  :class:`~tiered.cluster.reports.LoadReporter` on its host from what its hosted topics
  really did (messages and bytes appended and served, subscriptions, backlog). The
  harness's brokers share one process, so the CPU, memory and disk I/O a reporter would
  read are one process's and one machine's, neither theirs nor reproducible: the harness
  reports them as 0 (and no NIC or disk capacity), and the scores rest on the measured
  traffic alone. Registrations and
  reports are removed when the step ends, so the other steps (a takeover needs the dead
  owner unregistered) see the world they always saw.
* **Where the topic is.** Other steps move the topic by hand (seal here, load there),
  like an operator. Before deciding, the harness records that the way an operator's
  ``dnb move`` does: the topic's only assignment names its owner, and the leader adopts
  it (the placement record follows; nothing else is rewritten).
* **Imbalance by measured load** (``lm_move``). Every live broker hosts real
  *neighbour* topics (``/harness-load/b<i>-<k>``: loaded, produced to, sealed when the
  step ends; blacklisted, so the real topic is the only one the leader may move), and
  the harness produces to them and to the real topic every round (:class:`TrafficPlan`).
  The owner's broker carries the most traffic, the step's target the least, yet the
  target hosts as many topics as any broker: counted by topics (the fair strategy) the
  target is never the least loaded broker, so the leader, ranking by the balanced or
  weighted_load strategy, moves the topic there only because of the traffic its load
  reports measured. The leader's placement and history records of the neighbours are
  fixture state, written at every step like an operator's, and removed afterwards.
  While the traffic starts, rebalancing is paused (the operator's ``dnb cluster
  pause``): the leader folds a report every round, and once its smoothed loads have
  settled (:data:`WARMUP_ROUNDS`) the harness resumes it.
* **The assignment watcher.** After each leader step the harness does what a watcher
  does: the owner seals when its assignment is gone, the assignee loads once the topic
  is released. Every seal and load goes through the harness's usual continuity checks.

**Time.** Nothing here reads the machine's clock, so a seed plays out the same on a fast
and on a loaded machine. The load manager, its load reports and its election all run
on the harness clock (:meth:`LoadManagerDriver.clock`: :data:`ROUND_S` per round, still
between rounds); the rates in load reports are bytes and messages per harness second,
so a round's few kilobytes are megabytes per second, the unit the strategies' formulas
weigh against topic counts. The election's lease is refreshed at every round, and it is
granted for ``LEADER_TTL_S``: a day, in harness seconds for the election's own
certainty and in real seconds for the store's countdown, far longer than any scenario
lasts. So a term ends only where the schedule says.

Leader loss is the old leader's lease ending (revoked: what its expiry looks like to the
store) between two steps of a move, at the step the schedule names; a new leader
reconciles from stored state and finishes the move. The stale leader's token is then
used for one more write, which the fence must refuse (``lm-fenced``). A move the leader
does not finish within the round bound is ``lm-move-completes``, one that leaves the
topic unowned (sealed, not loaded) for more than :data:`UNOWNED_ROUNDS_MAX` rounds is
``lm-unowned-bound``; a move elsewhere than
the broker with the least measured load is ``lm-measured-move``, and a load report that
does not show the traffic the harness produced is ``lm-load-report``.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from tiered.cluster import admin, records
from tiered.cluster.actions import Transfer
from tiered.cluster.config import FailoverConfig, LoadManagerConfig, RebalancingConfig, Strategy
from tiered.cluster.leader import LeaderElection
from tiered.cluster.observe import read_snapshot
from tiered.cluster.reports import LoadReporter
from tiered.cluster.runtime import Executor, Fenced, LoadManager, RuntimeConfig
from tiered.lifecycle.ownership import registered_key
from tiered.metadata import keys
from tiered.metadata.base import Delete, Put
from tiered.tools.harness.model import Violation, check

LOAD_NS = "/harness-load/"
#: Harness seconds per round: the clock of the load manager and of its load reports.
ROUND_S = 0.001
#: Rounds (leader step + watcher) a step may take before its move counts as stuck.
ROUNDS_MAX = 40
#: Rounds a moving topic may end unowned (sealed by its source, not loaded by its
#: target): the leader assigns the target in the step that first sees the release, so
#: the topic is sealed at the end of one round and loaded in the next, leader loss or not.
UNOWNED_ROUNDS_MAX = 1
#: Rounds of traffic, rebalancing paused, before the leader may move: its smoothed loads
#: (EMA, 0.3 per report) then hold 1 − 0.7^12 ≈ 99 % of the step's rates, whatever the
#: topics carried before.
WARMUP_ROUNDS = 12
#: Where a leader loss may be injected in the middle of a move.
LEADER_LOSS_POINTS = ("released", "transfer", "assign")
#: The largest message the harness produces as traffic (a round's bytes are split).
TRAFFIC_MESSAGE_BYTES_MAX = 1000

LM_CONFIG = LoadManagerConfig(
    assignment_strategy=Strategy.BALANCED,
    load_report_interval_s=ROUND_S,
    assign_timeout_s=1e9,  # the harness's watcher never loses an assignment
    failover=FailoverConfig(grace_s=0.0, grace_unstable_s=0.0, stable_after_s=0.0),
    rebalancing=RebalancingConfig(enabled=True, check_interval_s=ROUND_S / 2, max_moves_per_hour=10_000,
                                  cooldown_s=0.0, min_topic_age_s=0.0, hit_count=1, settle_delay_s=0.0,
                                  cv_threshold=0.1, pingpong_window_s=0.0, blacklist_topics=(LOAD_NS + "*",)),
)
#: The leader lease: a day (see "Time" in the module docstring). Only an explicit
#: leader-loss step ends a term, never a slow machine.
LEADER_TTL_S = 86_400.0
LM_RUNTIME = RuntimeConfig(leader_ttl_s=LEADER_TTL_S)


@dataclass(frozen=True)
class TrafficPlan:
    """Who carries what during an ``lm_move`` step, in MB per harness second.

    With ``r`` the real topic's rate: the owner's broker hosts the real topic and one
    neighbour at ``r + 3``; the target hosts two idle neighbours; every other live
    broker one neighbour at ``r + 1.5``. Topic counts are then 2 on the owner and on the
    target and 1 elsewhere, so no count-based ranking picks the target. By traffic, with
    ``w(t) = 0.2 + 0.3·MB/s`` a topic's weighted load (balanced; weighted_load ranks by
    the same sums, or by throughput alone when the link is its bottleneck):

    =============  ==================  ===============  ==================
    broker         before              after the move   throughput after
    =============  ==================  ===============  ==================
    owner          1.3 + 0.6·r (most)  1.1 + 0.3·r      r + 3
    target         0.4 (least)         0.6 + 0.3·r      r
    any other      0.65 + 0.3·r        unchanged        r + 1.5
    =============  ==================  ===============  ==================

    So the real topic is the one candidate (the only topic not blacklisted) on the most
    loaded broker, the target is the least loaded one, the move lowers the imbalance
    (the owner-target gap exceeds the topic's own load) and leaves the target the least
    loaded broker, below the mean: however rebalancing continues, the topic is not on a
    source broker any more, so it moves exactly once.
    """

    topic_mb_s: float
    owner: int
    target: int
    #: broker index → the MB/s of each neighbour topic it hosts.
    neighbours: dict[int, tuple[float, ...]]

    @classmethod
    def for_move(cls, live: list[int], owner: int, target: int, topic_mb_s: float) -> "TrafficPlan":
        r = topic_mb_s
        neighbours = {i: ((r + 3.0,) if i == owner else (0.0, 0.0) if i == target else (r + 1.5,)) for i in live}
        return cls(r, owner, target, neighbours)

    def topics(self) -> dict[str, tuple[int, float]]:
        """Neighbour topic → (broker index, MB/s)."""
        return {f"{LOAD_NS}b{i}-{k}": (i, rate) for i, rates in sorted(self.neighbours.items())
                for k, rate in enumerate(rates)}


def round_bytes(mb_s: float) -> int:
    """The bytes a topic at ``mb_s`` MB per harness second receives in one round."""
    return round(mb_s * 1e6 * ROUND_S)


def split_bytes(total: int) -> list[int]:
    """``total`` bytes as message sizes of at most :data:`TRAFFIC_MESSAGE_BYTES_MAX`."""
    if total <= 0:
        return []
    count = -(-total // TRAFFIC_MESSAGE_BYTES_MAX)
    return [total // count + (1 if i < total % count else 0) for i in range(count)]


def config_for(strategy: str) -> LoadManagerConfig:
    return dataclasses.replace(LM_CONFIG, assignment_strategy=Strategy(strategy))


class LoadManagerDriver:
    """One scenario's load manager: leader(s), clock, staging (see the module docstring)."""

    def __init__(self, scenario: Any) -> None:
        self.scenario = scenario
        self.cluster = scenario.cluster
        self.metadata = self.cluster.inner_metadata
        self.topic = str(self.cluster.topic)
        self.rounds = 0
        self.leaders = 0
        self.config = LM_CONFIG
        self.lm: LoadManager | None = None
        self.reporters: dict[int, LoadReporter] = {}
        self.last_skipped: tuple[str, ...] = ()
        #: The step's traffic (None: none) and its neighbour topics: name → (broker, MB/s).
        self.plan: TrafficPlan | None = None
        self.neighbours: dict[str, tuple[int, float]] = {}
        #: Payload + key bytes the harness appended to each topic in the last round.
        self.produced: dict[str, int] = {}
        self.transfers: list[Transfer] = []
        self.loss_pending: str | None = None
        self.step_index = 0

    def clock(self) -> float:
        return 1_000_000.0 + self.rounds * ROUND_S

    # -- leaders -----------------------------------------------------------------------
    def _leader(self) -> LoadManager:
        if self.lm is None:
            self.leaders += 1
            node = f"lm-{self.leaders}"
            election = LeaderElection(self.metadata, node, LM_RUNTIME.leader_ttl_s, clock=self.clock,
                                      wall_clock=self.clock)
            self.lm = LoadManager(self.metadata, node, self.config, LM_RUNTIME, election=election, clock=self.clock)
            election.tick()
            check(election.is_leader(), "lm-leader", f"{node} did not win a vacant election")
        self.lm.config = self.config
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

    def stage(self, plan: TrafficPlan | None) -> None:
        """Registrations, the real topic's assignment as it really is, the neighbour
        topics (hosted, placed and assigned where the plan puts them), fresh reporters
        (a step's rates start with it), and a first report."""
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
            ops.append(Put(keys.assignment_key(owner, self.topic), keys.Assignment(self.clock(), "harness").to_json()))
        self.plan = plan
        self.neighbours = plan.topics() if plan is not None else {}
        for topic, (i, _) in sorted(self.neighbours.items()):
            broker = self.cluster.broker_id(i)
            placement = records.PlacementRecord("owned", broker, 0.0, self.clock(), reason="harness neighbour")
            ops.append(Put(records.placement_key(topic), records.encode(placement)))
            ops.append(Put(keys.assignment_key(broker, topic), keys.Assignment(self.clock(), "neighbour").to_json()))
        self.metadata.txn([], ops)
        for topic, (i, _) in sorted(self.neighbours.items()):
            self.cluster.host(i).load(topic)
        self.reporters = {}
        self.transfers = []
        self.report()

    def traffic(self) -> None:
        """One round of the plan's traffic: the real topic's messages are acknowledged
        and enter the model like any produce step's; a topic between the two halves of
        its move (sealed, not loaded yet) receives nothing."""
        self.produced = {}
        if self.plan is None:
            return
        for topic, (i, mb_s) in sorted(self.neighbours.items()):
            sizes = split_bytes(round_bytes(mb_s))
            if sizes:
                self.cluster.host(i).topic(topic).produce_many([b"n" * n for n in sizes], ack="durable")
            self.produced[topic] = sum(sizes)
        if self.scenario.sealed:
            return
        model, payloads = self.scenario.model, []
        for n in split_bytes(round_bytes(self.plan.topic_mb_s)):
            unique = model.next_payload(self.scenario.seed) + b"/"
            payloads.append(unique + b"t" * max(n - len(unique), 0))
        first, _ = self.scenario.hosted().produce_many(payloads, ack="durable")
        for k, payload in enumerate(payloads):
            model.appended(first + k, payload)
            model.acked(first + k, "durable")
        self.produced[self.topic] = sum(map(len, payloads))

    def report(self) -> None:
        ops = []
        for i in self.live():
            host = self.cluster.hosts[i]
            if host is None:  # not running now: an empty report (it hosts nothing)
                record = records.LoadReportRecord(self.cluster.broker_id(i), 0, self.clock())
            else:
                reporter = self.reporters.get(i)
                if reporter is None or reporter.host is not host:
                    reporter = self.reporters[i] = LoadReporter(host, interval_s=3600.0, clock=self.clock)
                record = reporter.build()
            # CPU, memory and disk I/O: not the harness broker's own (see the module docstring).
            record = dataclasses.replace(record, ts=self.clock(), cpu_pct=0.0, mem_pct=0.0, disk_io_bps=0.0)
            ops.append(Put(records.load_key(record.broker_id), records.encode(record)))
        self.metadata.txn([], ops)

    def unstage(self) -> None:
        """Seal the neighbours (their data stays archived, like any sealed topic's), and
        remove their placement and assignment records, the registrations and reports."""
        for topic, (i, _) in sorted(self.neighbours.items()):
            host = self.cluster.hosts[i]
            if host is not None and any(str(h.topic) == topic for h in host.topics()):
                host.unload(topic)
        ops: list[Any] = [Delete(registered_key(self.cluster.broker_id(i))) for i in range(len(self.cluster.hosts))]
        ops += [Delete(records.load_key(self.cluster.broker_id(i))) for i in range(len(self.cluster.hosts))]
        for topic, (i, _) in sorted(self.neighbours.items()):
            ops += [Delete(records.placement_key(topic)), Delete(keys.assignment_key(self.cluster.broker_id(i), topic))]
        self.metadata.txn([], ops)
        self.plan, self.neighbours, self.produced = None, {}, {}

    # -- running -----------------------------------------------------------------------
    def placement(self) -> records.PlacementRecord | None:
        kv = self.metadata.get(records.placement_key(self.topic))
        return None if kv is None else records.decode(records.PlacementRecord, kv.key, kv.value)

    def round(self) -> bool:
        """One round of traffic, reports and a leader step, then the watcher's part; True
        if the leader or the watcher did anything."""
        self.rounds += 1
        self.traffic()
        self.report()
        lm = self._leader()
        lm.election.tick()  # refresh, as the election thread would (harness time: see the docstring)
        check(lm.election.is_leader(), "lm-leader", f"{lm.node_id} lost its lease without a leader-loss step")
        report = lm.step()
        check(not report.fenced, "lm-fenced", "the only leader's write was refused by its own fence")
        if report.decision is not None and report.decision.checked:
            self.last_skipped = tuple(report.decision.skipped)
        self.transfers += [a for a in report.applied if isinstance(a, Transfer) and a.topic == self.topic]
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
        unowned = 0
        for _ in range(ROUNDS_MAX):
            busy = self.round()
            unowned += self.scenario.sealed
            check(unowned <= UNOWNED_ROUNDS_MAX, "lm-unowned-bound",
                  f"{what}: the topic ended {unowned} rounds sealed and not loaded anywhere "
                  f"(placement {self.placement()})")
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

    def check_reports_measure_the_traffic(self) -> None:
        """Every live broker's last report lists exactly the topics it hosts, each with
        the bytes the harness appended to it in the last round, per harness second (none
        for a topic the step does not write, such as a bystander: those are written
        between the steps only)."""
        snap = read_snapshot(self.metadata)
        expected: dict[str, dict[str, int]] = {}
        for i in self.live():
            host = self.cluster.hosts[i]
            hosted = [str(h.topic) for h in host.topics()] if host is not None else []
            expected[self.cluster.broker_id(i)] = {t: self.produced.get(t, 0) for t in hosted}
        for broker, topics in sorted(expected.items()):
            record = snap.reports.get(broker)
            got = {t.topic: t.bytes_in_rate * ROUND_S for t in record.topic_reports()} if record else {}
            check(set(got) == set(topics) and all(abs(got[t] - n) <= 1e-6 * max(n, 1) for t, n in topics.items()),
                  "lm-load-report", f"{broker} reports bytes per round {got}, the harness appended {topics}")

    # -- the step kinds ------------------------------------------------------------------
    def rebalance_step(self, index: int, to: int, leader_loss: str | None, strategy: str = "balanced",
                       topic_mb_s: float = 1.5) -> None:
        live = self.live()
        owner = self.scenario.owner
        target = to if to in live and to != owner else next((i for i in live if i != owner), None)
        if target is None:
            return
        self.config = config_for(strategy)
        plan = TrafficPlan.for_move(live, owner, target, topic_mb_s)
        self.stage(plan)
        try:
            # The operator pauses rebalancing while the traffic starts (see the docstring).
            admin.set_paused(self.metadata, True)
            for _ in range(WARMUP_ROUNDS):
                self.round()
            check(not self.transfers and self.scenario.owner == owner, "lm-measured-move",
                  f"the topic moved while rebalancing was paused ({self.transfers})")
            self.check_reports_measure_the_traffic()
            admin.set_paused(self.metadata, False)
            self.run_move(index, leader_loss, f"a load-manager rebalancing move ({strategy})")
            check(self.scenario.owner == target, "lm-measured-move",
                  f"the leader ({strategy}) did not move the topic from b{owner} to b{target}, the broker "
                  f"with the least measured load (it is on b{self.scenario.owner})")
            kinds = [h["kind"] for h in admin.history(self.metadata, self.topic)["history"]]
            check(kinds[-1:] == ["auto"], "lm-move-completes", f"the move's history is {kinds}")
            [move] = self.transfers
            self.scenario.note(f"step {index}: {strategy} moved the topic b{owner} -> b{target} on measured "
                               f"load (CV {move.cv_before:.3f} -> {move.cv_after:.3f}, topic load "
                               f"{move.estimated_load:.3f})")
        finally:
            admin.set_paused(self.metadata, False)
            self.unstage()
            self.config = LM_CONFIG

    def drain_step(self, index: int, leader_loss: str | None) -> None:
        live = self.live()
        owner = self.scenario.owner
        if len(live) < 2:
            return
        broker = self.cluster.broker_id(owner)
        self.stage(None)
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
