"""The compared balancers, as their documents and code describe them.

* ``danube-doc`` — Danube's load manager as its documentation describes it: Balanced
  float scores from the last reports plus a placeholder per assignment, round-robin
  within 10 % of the minimum, a check every 5 min moving the lightest topic of the most
  overloaded broker (load > mean + σ) to the least loaded one when CV > 30 %, cooldown
  60 s, minimum age 300 s, 10 moves per hour.
* ``danube-code`` — the same as its code does it (86ecb39): integer scores, rankings
  refreshed only by reports (a burst lands on one broker), an exact-minimum tie band
  below 10, σ floored at max(0.2·mean, 2) with a 0.5σ overload test and a fall-back to
  any broker above the mean, candidate score 0.5·MB/s + 0.3·connections, the minimum age
  used as the cooldown window and real age never checked, and the hourly history kept in
  leader memory (lost when the leader dies).
* ``pulsar-threshold`` — ThresholdShedder (usage = max of CPU, memory, NIC in/out;
  EMA with 90 % history; overloaded above average + 10 %; unload the biggest bundles
  until usage − average − 10 % + 5 % of the broker's throughput is shed; bundles unloaded
  in the last 30 min are skipped) with LeastLongTermMessageRate placement (long-term
  message rate plus preallocated bundles, infinite above 85 % usage, random among the
  minimal), every minute.
* ``pulsar-transfer`` — TransferShedder (target std 0.25, more than 3 consecutive hits,
  max→min pairs offloading (max − min)/2 from the top-10 bundles, 3 brokers per cycle,
  180 s delay after a transfer, 30 min per-bundle grace) with LeastResourceUsageWithWeight
  placement (random among brokers 10 % below the average), every minute.

Simplifications, the same for all: a Pulsar bundle is one topic; brokers report every
30 s; drains and failovers move a broker's topics at once through each algorithm's
placement; Pulsar's bundle swap and bundle splitting are not modelled.
"""
from __future__ import annotations

import math
import random

from bench.lmsim.world import B, MSG_BYTES, World

HOUR_S = 3600.0


class Baseline:
    name = "baseline"
    check_interval_s = 300.0

    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = random.Random(f"{world.seed}:{self.name}")
        self.last_check_at = -math.inf
        self.moved_at: dict[int, float] = {}

    # -- hooks -------------------------------------------------------------------------
    def on_reports(self) -> None: ...
    def on_leader_change(self) -> None: ...
    def place(self, i: int, exclude: set[str]) -> str | None: raise NotImplementedError
    def shed(self) -> None: ...

    # -- shared ------------------------------------------------------------------------
    def eligible(self, exclude: set[str] = frozenset()) -> list[str]:
        w = self.world
        return [b for b, s in sorted(w.brokers.items())
                if s.alive and s.mode == "active" and b in w.reports and b not in exclude]

    def move(self, i: int, target: str, kind: str, at: float | None = None) -> None:
        self.world.move(i, target, kind, at)
        self.moved_at[i] = self.world.now

    def step(self) -> None:
        w = self.world
        self.on_reports()
        if w.leader_changed_at is not None and w.leader_changed_at <= w.now:
            w.leader_changed_at = None
            self.on_leader_change()
        for b in sorted(w.brokers):
            if not w.registered(b) and w.on[b]:
                # They react to the registration's deletion as it happens (no grace).
                at = w.unregistered_since(b)
                for i in sorted(w.on[b]):
                    target = self.place(i, {b})
                    if target is not None:
                        self.move(i, target, "failover", at)
        for b, s in sorted(w.brokers.items()):
            if s.mode == "draining" and s.alive:
                for i in sorted(w.on[b]):
                    target = self.place(i, {b})
                    if target is not None:
                        self.move(i, target, "drain")
                w.mark_drained(b)
        for i in list(w.pending):
            target = self.place(i, set())
            if target is not None:
                w.assign(i, target)
        if w.now - self.last_check_at >= self.check_interval_s:
            self.last_check_at = w.now
            self.shed()


# -- Danube ------------------------------------------------------------------------------


class DanubeDoc(Baseline):
    name = "danube-doc"
    cv_threshold = 0.30
    moves_per_hour = 10
    cooldown_s = 60.0
    min_age_s = 300.0

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.scores: dict[str, float] = {}
        self.placeholders: dict[str, int] = {}
        self.rr_last: str | None = None
        self.history: list[float] = []

    def broker_score(self, b: str) -> float:
        r = self.world.reports[b]
        n = r.topics + self.placeholders.get(b, 0)
        wtl = (0.2 * n + 0.3 * (r.bytes_in_rate + r.bytes_out_rate) / 1e6 + 0.3 * r.connections
               + 0.2 * r.backlog / 1e4)
        return 0.3 * wtl + 0.35 * r.cpu_pct + 0.35 * r.mem_pct

    def on_reports(self) -> None:
        self.placeholders = {}
        self.scores = {b: self.broker_score(b) for b in self.world.reports}

    def on_leader_change(self) -> None:
        self.history = []  # where the code keeps it; the documented design persists it
        self.rr_last = None

    def topic_score(self, i: int) -> float:
        bytes_in, bytes_out, producers, consumers, backlog = self.world.topic_report(i, smoothed=False)
        return 0.2 + 0.3 * (bytes_in + bytes_out) / 1e6 + 0.3 * (producers + consumers) + 0.2 * backlog / 1e4

    def band(self, candidates: list[str]) -> list[str]:
        low = min(self.scores[b] for b in candidates)
        return [b for b in candidates if self.scores[b] <= 1.1 * low]

    def place(self, i: int, exclude: set[str]) -> str | None:
        candidates = self.eligible(exclude)
        if not candidates:
            return None
        members = self.band(candidates)
        target = next((b for b in members if self.rr_last is None or b > self.rr_last), members[0])
        self.rr_last = target
        self.placeholders[target] = self.placeholders.get(target, 0) + 1
        self.scores[target] = self.broker_score(target)
        return target

    def overloaded(self, loads: dict[str, float]) -> list[str]:
        mean = sum(loads.values()) / len(loads)
        std = math.sqrt(sum((v - mean) ** 2 for v in loads.values()) / len(loads))
        return sorted((b for b, v in loads.items() if v > mean + std), key=lambda b: -loads[b])

    def cooling(self, i: int) -> bool:
        moved = self.moved_at.get(i)
        return moved is not None and self.world.now - moved < self.cooldown_s

    def too_young(self, i: int) -> bool:
        return self.world.now - self.world.topics.created_at[i] < self.min_age_s

    def candidate_score(self, i: int) -> float:
        return self.topic_score(i)

    def shed(self) -> None:
        w = self.world
        brokers = self.eligible()
        if len(brokers) < 2:
            return
        loads = {b: self.scores[b] for b in brokers}
        mean = sum(loads.values()) / len(loads)
        std = math.sqrt(sum((v - mean) ** 2 for v in loads.values()) / len(loads))
        if mean <= 0 or std / mean <= self.cv_threshold:
            return
        self.history = [t for t in self.history if w.now - t < HOUR_S]
        if len(self.history) >= self.moves_per_hour:
            return
        for source in self.overloaded(loads):
            candidates = [i for i in w.on[source] if not self.cooling(i) and not self.too_young(i)]
            if not candidates:
                continue
            i = min(candidates, key=lambda x: (self.candidate_score(x), x))
            targets = [b for b in brokers if b != source]
            target = min(targets, key=lambda b: (loads[b], b))
            self.move(i, target, "auto")
            self.history.append(w.now)
            self.placeholders[target] = self.placeholders.get(target, 0) + 1
            self.scores[target] = self.broker_score(target)
            return


class DanubeCode(DanubeDoc):
    name = "danube-code"

    def on_reports(self) -> None:
        self.placeholders = {}
        self.scores = {b: float(int(self.broker_score(b))) for b in self.world.reports}

    def place(self, i: int, exclude: set[str]) -> str | None:
        # Rankings are integers and change only with reports: the placeholder pushed here
        # (0.2 · 0.3 = 0.06) is truncated away.
        candidates = self.eligible(exclude)
        if not candidates:
            return None
        low = min(self.scores[b] for b in candidates)
        limit = low if low < 10 else low + max(low / 10, 1)
        members = [b for b in candidates if self.scores[b] <= limit]
        target = next((b for b in members if self.rr_last is None or b > self.rr_last), members[0])
        self.rr_last = target
        return target

    def overloaded(self, loads: dict[str, float]) -> list[str]:
        mean = sum(loads.values()) / len(loads)
        std = math.sqrt(sum((v - mean) ** 2 for v in loads.values()) / len(loads))
        cv = std / mean if mean > 0 else 0.0
        floored = max(std, 0.2 * mean, 2.0)
        k = 0.5 if cv > 0.3 else 1.0
        over = [b for b, v in loads.items() if v > mean + k * floored]
        if not over:
            over = [b for b, v in loads.items() if v > mean]
        return sorted(over, key=lambda b: -loads[b])

    def cooling(self, i: int) -> bool:
        moved = self.moved_at.get(i)
        return moved is not None and self.world.now - moved < self.min_age_s

    def too_young(self, i: int) -> bool:
        return False

    def candidate_score(self, i: int) -> float:
        bytes_in, bytes_out, producers, consumers, _backlog = self.world.topic_report(i, smoothed=False)
        return 0.5 * (bytes_in + bytes_out) / 1e6 + 0.3 * (producers + consumers)

    def shed(self) -> None:
        # No placeholder after a move either: the integer ranking waits for the next report.
        super().shed()
        self.placeholders = {}
        self.scores = {b: float(int(self.broker_score(b))) for b in self.world.reports}


# -- Pulsar ------------------------------------------------------------------------------


def max_usage(world: World, b: str) -> float:
    r = world.reports[b]
    nic = world.brokers[b].nic_bps
    return max(r.cpu_pct / 100.0, r.mem_pct / 100.0, r.net_in_bps / nic, r.net_out_bps / nic)


class PulsarThreshold(Baseline):
    name = "pulsar-threshold"
    check_interval_s = 60.0
    threshold = 0.10
    margin = 0.05
    history_percentage = 0.9
    min_unload_bps = 10 * 2**20
    grace_s = 30 * 60.0
    overload = 0.85
    new_bundle_msg_rate = 100.0

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.avg_usage: dict[str, float] = {}
        self.preallocated: dict[str, float] = {}
        self.long_term: dict[str, float] = {}

    def on_reports(self) -> None:
        # Long-term message rates as reported (a day's average: no wave, no noise), plus
        # the bundles preallocated to a broker since its report.
        self.long_term = {b: self.world.agg[b][B] / MSG_BYTES for b in self.world.reports}
        self.preallocated = {}

    def on_leader_change(self) -> None:
        self.avg_usage = {}
        self.moved_at = {}

    def place(self, i: int, exclude: set[str]) -> str | None:
        w = self.world
        candidates = self.eligible(exclude)
        if not candidates:
            return None
        scores = {}
        for b in candidates:
            if max_usage(w, b) > self.overload:
                scores[b] = math.inf
            else:
                scores[b] = self.long_term.get(b, 0.0) + self.preallocated.get(b, 0.0)
        low = min(scores.values())
        best = [b for b in candidates if scores[b] == low]
        target = self.rng.choice(best)
        rate = self.new_bundle_msg_rate if w.owner[i] is None else w.long_term_msg_rate(i)
        self.preallocated[target] = self.preallocated.get(target, 0.0) + rate
        return target

    def shed(self) -> None:
        w = self.world
        brokers = self.eligible()
        if not brokers:
            return
        for b in brokers:
            u = max_usage(w, b)
            prev = self.avg_usage.get(b)
            self.avg_usage[b] = u if prev is None else prev * self.history_percentage + (1 - self.history_percentage) * u
        avg = sum(self.avg_usage[b] for b in brokers) / len(brokers)
        if avg == 0:
            return
        unloads = []
        for b in brokers:
            usage = self.avg_usage[b]
            if usage < avg + self.threshold:
                continue
            r = w.reports[b]
            throughput = r.bytes_in_rate + r.bytes_out_rate
            to_offload = throughput * (usage - avg - self.threshold + self.margin)
            if to_offload < self.min_unload_bps or len(w.on[b]) <= 1:
                continue
            bundles = []
            for i in w.on[b]:
                moved = self.moved_at.get(i)
                if moved is not None and w.now - moved < self.grace_s:
                    continue
                bytes_in, bytes_out, *_ = w.topic_report(i, smoothed=True)  # short-term average
                bundles.append((-(bytes_in + bytes_out), i))
            bundles.sort()
            marked = 0.0
            for neg, i in bundles:
                if marked >= to_offload:
                    break
                unloads.append((b, i))
                marked += -neg
        for source, i in unloads:
            target = self.place(i, set())
            if target is not None and target != source:
                self.move(i, target, "shed")
            else:
                self.moved_at[i] = w.now  # unloaded and reloaded in place: still "recently unloaded"


class PulsarTransfer(Baseline):
    name = "pulsar-transfer"
    check_interval_s = 60.0
    target_std = 0.25
    hit_count_threshold = 3
    shedding_delay_s = 180.0
    brokers_per_cycle = 3
    top_bundles = 10
    grace_s = 30 * 60.0
    overload = 0.85
    diff_threshold = 0.10

    def __init__(self, world: World) -> None:
        super().__init__(world)
        self.ema: dict[str, float] = {}
        self.thr_ema: dict[str, float] = {}
        self.hits = 0
        self.unloaded_brokers: dict[str, float] = {}

    def on_reports(self) -> None:
        w = self.world
        for b, r in w.reports.items():
            u = max_usage(w, b)
            thr = r.bytes_in_rate + r.bytes_out_rate
            self.ema[b] = u if b not in self.ema else 0.9 * self.ema[b] + 0.1 * u
            self.thr_ema[b] = thr if b not in self.thr_ema else 0.9 * self.thr_ema[b] + 0.1 * thr

    def on_leader_change(self) -> None:
        self.hits = 0
        self.unloaded_brokers = {}
        self.moved_at = {}

    def place(self, i: int, exclude: set[str]) -> str | None:
        candidates = self.eligible(exclude)
        if not candidates:
            return None
        avg = sum(self.ema[b] for b in candidates) / len(candidates)
        best = [b for b in candidates if self.ema[b] + self.diff_threshold <= avg]
        return self.rng.choice(best or candidates)

    def shed(self) -> None:
        w = self.world
        brokers = self.eligible()
        if len(brokers) < 2:
            return
        for b, at in list(self.unloaded_brokers.items()):
            if b in w.reports and w.reports[b].ts - at < self.shedding_delay_s:
                return  # CoolDown: give brokers time to report the last transfer
            self.unloaded_brokers.pop(b)
        loads = {b: self.ema[b] for b in brokers}
        n = len(loads)
        total, total_sq = sum(loads.values()), sum(v * v for v in loads.values())
        avg = total / n
        std = math.sqrt(max(total_sq / n - avg * avg, 0.0))
        ordered = sorted(brokers, key=lambda b: loads[b])
        lo, hi = 0, len(ordered) - 1
        under_k = min(0.5, self.target_std / 2)

        def underloaded(b: str) -> bool:
            return loads[b] < avg * under_k or self.thr_ema[b] < self.thr_ema[ordered[hi]] * under_k

        def overloaded(b: str) -> bool:
            return loads[b] > self.overload and loads[b] > avg + self.target_std

        if std > self.target_std or underloaded(ordered[lo]) or overloaded(ordered[hi]):
            self.hits += 1
        else:
            self.hits = 0
        if self.hits <= self.hit_count_threshold:
            return
        decided = 0
        shed_brokers = 0
        while shed_brokers < self.brokers_per_cycle and lo < hi:
            if not (std > self.target_std or underloaded(ordered[lo]) or overloaded(ordered[hi])):
                break
            source, target = ordered[hi], ordered[lo]
            hi -= 1
            max_load, min_load = loads[source], loads[target]
            if max_load <= 0:
                continue
            offload = (max_load - min_load) / 2
            r = w.reports[source]
            source_thr = r.bytes_in_rate + r.bytes_out_rate
            offload_thr = source_thr * offload / max_load
            top = []
            for i in w.on[source]:
                bytes_in, bytes_out, *_ = w.topic_report(i, smoothed=True)
                top.append((-(bytes_in + bytes_out), i))
            top = sorted(top)[:self.top_bundles]
            if len(top) <= 1:
                continue
            remaining, marked = len(top), 0.0
            for neg, i in top:
                moved = self.moved_at.get(i)
                if moved is not None and w.now - moved < self.grace_s:
                    continue
                if remaining <= 1 or marked - neg > offload_thr:
                    break
                self.move(i, target, "shed")
                decided += 1
                marked += -neg
                remaining -= 1
            if marked > 0:
                adjusted = marked * max_load / source_thr if source_thr > 0 else 0.0
                new_max, new_min = max(0.0, max_load - adjusted), min_load + adjusted
                total_sq += new_max ** 2 + new_min ** 2 - max_load ** 2 - min_load ** 2
                std = math.sqrt(abs(total_sq / n - avg * avg))
                self.unloaded_brokers[source] = w.now
                self.unloaded_brokers[target] = w.now
            lo += 1
            shed_brokers += 1
        if decided:
            self.hits = 0


BASELINES = {cls.name: cls for cls in (DanubeDoc, DanubeCode, PulsarThreshold, PulsarTransfer)}
