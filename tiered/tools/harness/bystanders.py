"""Bystander topics: many topics per broker, sharing its WAL root's commit group and
shared journal with the scenario's topic, writing while that topic moves, crashes and
loses power.

Each fault-injecting broker hosts a few bystanders. Between two steps of the schedule
(never inside one, so a seed stays deterministic) every bystander on a running broker
gets a few messages: most acknowledged as durable, some only appended (still pending in
the group when the next step crashes the broker or cuts its power). Now and then a
bystander moves to another running broker (seal, then load) while the others keep
writing. A broker whose process was rebuilt since the last look (a restart, a power loss,
a takeover's dead owner coming back) loads its bystanders again, and each must then hold
every acknowledged message under its offset (``bystander-durable``), offsets contiguous
from 0, and no offset a message other than the one appended under it
(``bystander-unique``). The final checks read every bystander whole.

A bystander never touches the scenario's topic, its model or its schedule: its choices
come from a random generator of its own, seeded from the scenario's seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tiered.lifecycle.errors import TopicNotHosted
from tiered.read.reader import read_messages
from tiered.tools.harness.cluster import WAIT_BOUND_S, Cluster
from tiered.tools.harness.model import Violation, check
from wal.topics import TopicName

PER_BROKER = 3


@dataclass
class _Bystander:
    topic: TopicName
    broker: int
    appended: dict[int, bytes] = field(default_factory=dict)  # offset -> payload, as appended
    acked: int = -1  # highest offset acknowledged as durable
    host: Any = None  # the host object it was last loaded on (a rebuilt host must load it again)
    sequence: int = 0


class Bystanders:
    def __init__(self, seed: int, cluster: Cluster) -> None:
        self.cluster = cluster
        self.rng = random.Random(seed * 7919 + 17)
        self.seed = seed
        self.topics = [_Bystander(TopicName.parse(f"/harness/by-{b}-{k}"), b)
                       for b in range(cluster.brokers) for k in range(PER_BROKER)]

    def tick(self) -> None:
        """Between two steps: reload where a broker came back, write, sometimes move one."""
        for by in self.topics:
            host = self._running(by.broker)
            if host is None:
                continue
            if by.host is not host and not self._reload(by, host):
                continue
            self._write(by, host)
        if self.rng.random() < 0.15:
            self._move_one()

    def final_checks(self) -> None:
        for by in self.topics:
            host = self.cluster.host(by.broker)
            if by.host is not host:
                check(self._reload(by, host), "bystander-durable",
                      f"bystander {by.topic} did not load on broker {by.broker} with no fault active")
            hosted = host.topic(by.topic)
            hosted.wal.flush(WAIT_BOUND_S)
            self._check_whole(by, hosted, "the final read")

    # -- helpers ---------------------------------------------------------------------
    def _running(self, broker: int) -> Any:
        return self.cluster.hosts[broker]

    def _reload(self, by: _Bystander, host: Any) -> bool:
        """Load ``by`` on the rebuilt ``host`` and check what survived; False when the load
        failed under an injected fault (tried again at the next tick)."""
        try:
            hosted = host.topic(by.topic) if _hosts(host, by.topic) else host.load(by.topic)
        except Violation:
            raise
        except Exception:  # noqa: BLE001 - a fault of the current step; the final checks retry without faults
            return False
        by.host = host
        self._check_whole(by, hosted, f"a reload on broker {by.broker}")
        return True

    def _check_whole(self, by: _Bystander, hosted: Any, when: str) -> None:
        tip = hosted.next_offset
        check(tip > by.acked, "bystander-durable",
              f"after {when}, bystander {by.topic} continues at {tip}, below its acknowledged offset {by.acked}")
        got = read_messages(hosted.create_reader(0, live=False), None)
        offsets = [m.offset for m in got]
        check(offsets == list(range(len(got))), "bystander-durable",
              f"after {when}, bystander {by.topic} reads offsets {offsets[:5]}... ({len(got)} in all), "
              f"not 0-{len(got) - 1}")
        check(len(got) > by.acked, "bystander-durable",
              f"after {when}, bystander {by.topic} holds offsets up to {len(got) - 1}, "
              f"but {by.acked} was acknowledged")
        for m in got:
            check(by.appended.get(m.offset) == m.payload, "bystander-unique",
                  f"after {when}, bystander {by.topic} holds at offset {m.offset} a message never appended there")
        # What was never acknowledged and did not survive is gone for good: its offsets are
        # handed out again from the tip, so the model forgets them.
        for offset in [o for o in by.appended if o >= tip]:
            del by.appended[offset]

    def _write(self, by: _Bystander, host: Any) -> None:
        hosted = host.topic(by.topic)
        for _ in range(self.rng.randrange(1, 4)):
            by.sequence += 1
            payload = f"bystander {by.topic} seed {self.seed} #{by.sequence}".encode()
            if self.rng.random() < 0.7:
                offset = hosted.produce(payload, ack="durable")
                by.appended[offset] = payload
                by.acked = max(by.acked, offset)
            else:
                by.appended[hosted.append(payload)] = payload

    def _move_one(self) -> None:
        running = [b for b in range(self.cluster.brokers) if self._running(b) is not None]
        movable = [by for by in self.topics if by.host is not None and by.host is self._running(by.broker)]
        if len(running) < 2 or not movable:
            return
        by = self.rng.choice(movable)
        target = self.rng.choice([b for b in running if b != by.broker])
        source = self._running(by.broker)
        hosted = source.topic(by.topic)
        tip = hosted.next_offset - 1
        try:
            last = source.unload(by.topic)
        except Exception:  # noqa: BLE001 - a fault of the current step: the seal is retried later
            return
        check(last == (None if tip < 0 else tip), "bystander-durable",
              f"bystander {by.topic} sealed at {last}, its tip was {tip}")
        by.acked = tip  # a seal flushes: everything appended is durable now
        by.broker, by.host = target, None
        self._reload(by, self._running(target))


def _hosts(host: Any, topic: TopicName) -> bool:
    try:
        host.topic(topic)
        return True
    except TopicNotHosted:
        return False
