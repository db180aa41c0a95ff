"""Schedules: every random choice of a scenario, derived from one seed.

``make_schedule(seed, ...)`` is a pure function, so ``dnb harness --seed S`` replays
exactly the steps that failed. The runner draws no randomness of its own: even the
byte count at which a power loss tears the last write is part of the step.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

#: (kind, weight). Producing and consuming dominate; every failure kind still shows
#: up in most schedules of 12+ steps.
STEP_WEIGHTS: tuple[tuple[str, int], ...] = (
    ("produce", 24),        # append N messages, wait for durable (or archived) acks
    ("produce_nowait", 6),  # append without waiting: may die in a power loss, never acked
    ("upload", 10),         # one upload pass on the owner
    ("consume", 18),        # a subscription reads (and mostly acks) through the tiered reader
    ("move", 9),            # clean move: seal on the owner, restore on another broker
    ("restart", 6),         # owner process crashes (page cache survives); same broker reloads
    ("power_loss", 6),      # owner loses unsynced bytes (fault-injecting fs); same broker reloads
    ("takeover", 5),        # owner dies unsealed; ANOTHER broker loads (failover)
    ("uploader_crash", 5),  # the broker dies at a step inside an upload; same broker reloads
    ("s3_fault", 5),        # object store fails during an upload or a seal; retried after
    ("etcd_fault", 5),      # metadata store fails during an upload or a seal; retried after
    ("failed_load", 4),     # owner restarts and its first load fails at one step; the next recovers
    ("disk_full_load", 3),  # owner restarts on a full disk: loads fail, nothing renumbered; space freed
    ("second_opener", 3),   # a second host / WAL opener on the owner's directory is refused
    ("stale_owner", 4),     # another broker takes over while the owner still runs: it must stop acking
    ("delayed_write", 3),   # a cursor write times out and is applied later, after a newer one
    ("impostor", 3),        # a committed object is replaced behind the archive's back; readers refuse it
    ("lm_move", 6),         # the leader moves the topic off the broker its measured traffic overloads (maybe losing its lease mid-move)
    ("lm_drain", 3),        # the owner's broker is drained by the leader (maybe losing its lease mid-move), then undrained
    ("delete_recreate", 3),  # the topic is deleted (owner sealing, paused or dead; a reader open; the deleter dying mid-delete) and re-created
    ("archive_retention", 5),  # the owner's uploader cuts the archive by a size or age policy (maybe dying mid-cut)
)
LEADER_LOSS = (None, None, "transfer", "released", "assign")
#: The strategies an ``lm_move`` ranks brokers by (both weigh the measured traffic).
MEASURED_STRATEGIES = ("balanced", "weighted_load")
LOAD_FAILURE_STEPS = ("open WAL", "mark topic open", "clamp subscription cursors", "start uploader",
                      "open subscriptions")
SUBSCRIPTIONS = ("s0", "s1")
UPLOADER_CRASH_POINTS = ("read", "before_put", "after_put", "before_commit", "after_commit")
#: Who deletes: the owner's host (sealing first), another broker while the owner still
#: runs unaware (a paused zombie), another broker after the owner died unsealed.
DELETE_HOWS = ("clean", "paused", "crashed")
#: A reader open across the delete: none, one on the owner, an archive-only one.
DELETE_READERS = (None, "owner", "archive")
#: The steps of ``tiered.lifecycle.delete`` after which the deleting broker may die.
DELETE_CRASH_POINTS = ("tombstone", "cursors", "cluster records", "descriptors", "objects", "progress",
                       "lost ranges", "archive start", "state")
#: The steps of an archive retention cut after which the owner may die.
RETENTION_CRASH_POINTS = ("after_start_raised", "after_descriptors_deleted")


@dataclass(frozen=True)
class Step:
    kind: str
    args: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.args.items())
        return f"{self.kind}({inner})"


def make_schedule(seed: int, brokers: int = 3, steps: int = 12, subprocess_crashes: bool = False) -> list[Step]:
    rng = random.Random(f"schedule-{seed}")
    kinds = [k for k, _ in STEP_WEIGHTS]
    weights = [w for _, w in STEP_WEIGHTS]
    if subprocess_crashes:
        kinds.append("sigkill")
        weights.append(6)
    # Start with data so even short schedules exercise the archive.
    schedule = [Step("produce", {"count": rng.randint(1, 6), "ack": "durable"})]
    for _ in range(steps - 1):
        kind = rng.choices(kinds, weights)[0]
        schedule.append(Step(kind, _args(kind, rng, brokers)))
    return schedule


def _args(kind: str, rng: random.Random, brokers: int) -> dict[str, Any]:
    if kind == "produce":
        return {"count": rng.randint(1, 8), "ack": "archived" if rng.random() < 0.2 else "durable"}
    if kind == "produce_nowait":
        return {"count": rng.randint(1, 5)}
    if kind == "consume":
        return {"subscription": rng.choice(SUBSCRIPTIONS), "max": rng.randint(1, 12), "ack": rng.random() < 0.8}
    if kind in ("move", "takeover"):
        return {"to": rng.randrange(brokers)}  # the runner picks another broker if this is the owner
    if kind == "power_loss":
        return {"torn_bytes": rng.choice((0, 0, 1, 7, 16, 40))}
    if kind == "uploader_crash":
        return {"point": rng.choice(UPLOADER_CRASH_POINTS)}
    if kind == "s3_fault":
        return {"during": rng.choice(("upload", "seal")), "op": rng.choice(("put", "get", "list")),
                "transient": rng.random() < 0.5}
    if kind == "etcd_fault":
        return {"during": rng.choice(("upload", "seal")), "op": rng.choice(("txn", "range", "get")),
                "transient": rng.random() < 0.5, "when": rng.choice(("before", "after"))}
    if kind == "failed_load":
        return {"step": rng.choice(LOAD_FAILURE_STEPS)}
    if kind == "disk_full_load":
        return {"attempts": rng.randint(1, 2)}
    if kind == "stale_owner":
        return {"to": rng.randrange(brokers), "learns_by": rng.choice(("progress", "upload", "cursor")),
                "store_ignores_if_none_match": rng.random() < 0.5}
    if kind == "impostor":
        return {"which": rng.random(), "byte": rng.random()}
    if kind == "delayed_write":
        return {"subscription": rng.choice(SUBSCRIPTIONS), "max": rng.randint(2, 12)}
    if kind == "lm_move":
        return {"to": rng.randrange(brokers), "leader_loss": rng.choice(LEADER_LOSS),
                "strategy": rng.choice(MEASURED_STRATEGIES), "mb_s": round(rng.uniform(0.5, 2.5), 3)}
    if kind == "lm_drain":
        return {"leader_loss": rng.choice(LEADER_LOSS)}
    if kind == "delete_recreate":
        return {"how": rng.choice(DELETE_HOWS), "deleter": rng.randrange(brokers),
                "recreate_on": rng.randrange(brokers), "reader": rng.choice(DELETE_READERS),
                "crash_at": rng.choice(DELETE_CRASH_POINTS) if rng.random() < 0.3 else None,
                "zombie_writes": rng.randint(0, 3), "learns_by": rng.choice(("progress", "upload", "cursor"))}
    if kind == "archive_retention":
        return {"policy": rng.choice(("bytes", "bytes", "age")), "keep": rng.choice((0.0, 0.3, 0.6, 1.0)),
                "rounds": rng.randint(0, 3), "per_round": rng.randint(1, 4),
                "crash_at": rng.choice(RETENTION_CRASH_POINTS) if rng.random() < 0.3 else None}
    if kind == "sigkill":
        return {"count": rng.randint(5, 40), "after_s": round(rng.uniform(0.0, 0.5), 3)}
    return {}

