"""The brokers, stores and fault switches one scenario runs on.

* N in-process :class:`~tiered.lifecycle.BrokerHost` brokers, each with its own WAL
  root on its own fault-injecting file system (``wal.testing.FaultFs``), so a power loss is
  ``crash_image()``: unsynced bytes dropped, the last write torn.
* One extra broker on the real disk, used by SIGKILLed subprocess brokers.
* Shared metadata and object stores wrapped in fault injectors (``FaultPlan``).

Brokers do not register sessions: the harness itself decides who is dead, and a
takeover is the lifecycle's failover path (holder not registered). A dead broker keeps
its disk: when the harness next builds a host for it, the host retires its stale WAL
(quarantine + exact lost range), which the checker compares with the takeover.
"""
from __future__ import annotations

import json
import os
from typing import Any

from native.errors import DnbError
from tiered.lifecycle import BrokerHost
from tiered.lifecycle.config import BrokerConfig
from tiered.metadata import open_metadata
from tiered.metadata.keys import STORAGE_TOPICS_PREFIX
from tiered.metadata.testing.faults import FaultPlan, FaultyMetadataStore
from tiered.objects import open_objects
from tiered.objects.testing.faults import FaultyObjectStore
from uploader.config import UploaderConfig
from wal.config import WalConfig
from wal.testing import FaultFs
from wal.topics import TopicName


class HarnessCrash(DnbError):
    """Raised by the uploader fault hook: the broker process 'dies' at that step."""


class CrashHook:
    """The uploader's ``fault_hook``: fires once at the armed step, then disarms."""

    def __init__(self) -> None:
        self.armed: str | None = None
        self.fired = False

    def arm(self, step: str) -> None:
        self.armed, self.fired = step, False

    def __call__(self, step: str) -> None:
        if self.armed is not None and step == self.armed:
            self.armed, self.fired = None, True
            raise HarnessCrash(f"injected broker crash at uploader step {step!r}")


class Cluster:
    def __init__(self, root: str, brokers: int, topic: TopicName, metadata_url: str, objects_url: str,
                 commit_group: bool = True) -> None:
        self.root, self.topic, self.brokers = root, topic, brokers
        self.metadata_url, self.objects_url = metadata_url, objects_url
        self.metadata_faults, self.object_faults = FaultPlan(), FaultPlan()
        self.inner_metadata = open_metadata(metadata_url)
        self.inner_objects = open_objects(objects_url)
        self.metadata = FaultyMetadataStore(self.inner_metadata, self.metadata_faults)
        self.objects = FaultyObjectStore(self.inner_objects, self.object_faults)
        self.crash_hook = CrashHook()
        self.config = _config(self.crash_hook, commit_group)
        # Index `brokers` is the real-disk broker (subprocess crashes); the rest use FaultFs.
        self.fs: list[Any] = [FaultFs() for _ in range(brokers)] + [None]
        self.hosts: list[Any] = [None] * (brokers + 1)

    # -- brokers -------------------------------------------------------------------
    def broker_id(self, index: int) -> str:
        return f"b{index}"

    def wal_root(self, index: int) -> str:
        return os.path.join(self.root, f"wal-{index}")

    def host(self, index: int) -> Any:
        if self.hosts[index] is None:
            self.hosts[index] = BrokerHost(self.broker_id(index), self.wal_root(index), self.metadata,
                                           self.objects, self.config, wal_fs=self.fs[index])
        return self.hosts[index]

    def load(self, index: int) -> Any:
        """Load the topic on broker ``index`` (restore, recovery or takeover)."""
        return self.host(index).load(self.topic)

    def crash(self, index: int) -> None:
        """The broker process dies: topics dropped unsealed; its page cache survives."""
        host = self.hosts[index]
        if host is not None:
            host.close(unload=False)
        self.hosts[index] = None

    def power_loss(self, index: int, torn_bytes: int) -> None:
        """The machine loses power: only fsynced bytes survive, the last write torn.
        (The real-disk broker cannot drop its page cache: there it is a process crash.)"""
        if self.fs[index] is None:
            self.crash(index)
            return
        published = self._published_tips()
        image = self.fs[index].crash_image(torn_bytes=torn_bytes)
        self.crash(index)
        self._unpublish_after(index, published)
        self.fs[index] = image

    def _published_tips(self) -> dict[str, bytes]:
        """Every progress record (a published durable tip), by key."""
        return {kv.key: kv.value for kv in self.inner_metadata.range(STORAGE_TOPICS_PREFIX)
                if kv.key.endswith("/progress")}

    def _unpublish_after(self, index: int, before: dict[str, bytes]) -> None:
        """A machine that lost its power publishes nothing after that instant. The model's
        crash closes the host after the image was taken, and its close publishes the tips
        it reached in memory (past what the image kept): every record broker ``index``
        wrote since is put back as it was (another owner's, or none), so metadata never
        claims durable what the power loss took."""
        for kv in self.inner_metadata.range(STORAGE_TOPICS_PREFIX):
            if (not kv.key.endswith("/progress") or _published_by(kv.value) != self.broker_id(index)
                    or before.get(kv.key) == kv.value):
                continue
            if kv.key in before:
                self.inner_metadata.put(kv.key, before[kv.key])
            else:
                self.inner_metadata.delete(kv.key)

    def local_wal_dir(self, index: int) -> str | None:
        """A WAL root verify can scan (only the real-disk broker has one)."""
        return self.wal_root(index) if self.fs[index] is None else None

    def clear_faults(self) -> None:
        self.metadata_faults.clear()
        self.object_faults.clear()
        self.crash_hook.armed = None

    def close(self) -> None:
        self.clear_faults()
        for index in range(len(self.hosts)):
            try:
                self.crash(index)
            except Exception:  # noqa: BLE001 - closing after a violation must not mask it
                pass
        self.objects.close()
        self.metadata.close()


def _published_by(raw: bytes) -> str | None:
    """The broker id a progress record names (None when it does not parse)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    broker = body.get("broker_id") if isinstance(body, dict) else None
    return broker if isinstance(broker, str) else None


#: The bound of every wait that ends on an event (an fsync, an upload, a drain, a
#: thread's exit). Reaching it is a failure, so it is far beyond what a loaded machine
#: needs: a seed's outcome must not depend on the machine's speed. Waiting costs only
#: the time the event takes; faults end by retry counts, not by these bounds (the one
#: exception, a seal under a fault that never heals, uses ``FAULTED_SEAL_DRAIN_S``).
WAIT_BOUND_S = 120.0
#: The drain bound of a seal under a fault that stays until the seal gave up: that seal
#: fails however long it tries, so a short bound only keeps the scenario fast.
FAULTED_SEAL_DRAIN_S = 2.0


def _config(hook: CrashHook, commit_group: bool = True) -> Any:
    # Small retry backoffs so faults resolve in milliseconds: a scenario takes ~0.3 s.
    uploader = UploaderConfig(interval_s=3600.0, retry_attempts_max=3, retry_backoff_s=0.001,
                              retry_backoff_max_s=0.005, drain_timeout_s=WAIT_BOUND_S, poll_interval_s=5.0,
                              compression="none", fault_hook=hook)
    # Group budgets far below the defaults: every scenario trims caches (readers fall back
    # to segment files) and may hold appends back on the pending budget (wal/cache.py,
    # native.PendingBudget), under every move, crash and fault it draws. Without a commit
    # group (a quarter of the seeds: ``run_scenario``) each WAL has its own writer thread
    # and the root's budgets are shared among them (wal/budget.py).
    wal_config = WalConfig(close_timeout_s=WAIT_BOUND_S, cache_group_bytes_max=16 * 1024,
                           max_message_bytes=64 * 1024, pending_group_bytes_max=64 * 1024,
                           commit_group=commit_group)
    return BrokerConfig(wal_config=wal_config, uploader=uploader,
                        register_session=False, progress_interval_s=0.05, produce_timeout_s=WAIT_BOUND_S,
                        flush_timeout_s=WAIT_BOUND_S, close_timeout_s=WAIT_BOUND_S)
