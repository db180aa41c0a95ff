"""Errors of the topic lifecycle: each names the topic and the ``step`` that failed."""
from __future__ import annotations

from native.errors import DnbError
from wal.topics import TopicName


class LifecycleError(DnbError):
    """Base class of load/unload/produce errors; ``step`` names what failed."""

    def __init__(self, topic: TopicName, step: str, detail: str) -> None:
        super().__init__(f"topic {topic}: {step} failed: {detail}")
        self.topic = topic
        self.step = step


class LoadError(LifecycleError):
    """Loading failed at ``step``; ownership was released again when that was safe."""


class LocalWalUnreadable(LoadError):
    """This broker's local WAL of the topic exists but does not open (corrupt, disk full,
    I/O error). It may hold acknowledged messages nobody archived, so it is never moved
    aside or renumbered silently: the topic stays unloaded and owned by this broker until
    the WAL is repaired, or an operator discards it explicitly
    (``load(..., discard_local_wal=True)``, ``dnb restore --discard-local-wal``), which
    records the lost range first."""

    def __init__(self, topic: TopicName, path: str, cause: BaseException) -> None:
        super().__init__(topic, "open WAL", f"local WAL {path} does not open ({type(cause).__name__}: {cause}); "
                         "it is kept as it is and the topic stays owned by this broker. Repair it, or "
                         "discard it explicitly (dnb restore --discard-local-wal), which records the lost range")
        self.path = path


class OwnHistoryElsewhere(LoadError):
    """This broker id holds the topic unsealed, its open history (the epoch that last
    marked the topic open) was written by this broker id, and this WAL root has no WAL of
    that history: it lives in another data dir (a mistyped ``--data-dir``, a broker started
    on the wrong disk). A load here would take that history over: record its unarchived
    acknowledged messages lost and number new ones at their offsets. Refused, nothing
    written. Use the right data dir; or, when that WAL is really gone, accept the loss
    explicitly (``load(..., accept_lost_own_history=True)``, ``dnb restore --takeover``, or
    ``broker.own_history_elsewhere = "take_over"``)."""

    def __init__(self, topic: TopicName, broker_id: str, epoch: int, wal_path: str, found: str) -> None:
        super().__init__(topic, "load", f"broker {broker_id} holds it unsealed and its open history (epoch {epoch}) "
                         f"is not in this data dir ({wal_path}: {found}). Is the data dir right? A load here would "
                         "record that history's unarchived messages lost and reuse their offsets. To accept that "
                         f"loss (its WAL is gone): dnb --broker-id {broker_id} restore --takeover {topic}")
        self.broker_id = broker_id
        self.epoch = epoch
        self.wal_path = wal_path


class WalRootOwnedByAnotherBroker(DnbError):
    """The WAL root was first used by another broker id (``<root>/.broker``). Retiring its
    WALs as stale under this id would throw that broker's unarchived history away, so
    the host refuses to start (Kafka refuses a ``broker.id`` that differs from its log
    directory's ``meta.properties`` for the same reason)."""

    def __init__(self, wal_root: str, found: str, broker_id: str) -> None:
        super().__init__(f"WAL root {wal_root} belongs to broker {found!r}, not {broker_id!r}: refused (a "
                         f"host started with the wrong --broker-id would retire that broker's WALs as stale)")
        self.wal_root = wal_root
        self.found = found
        self.broker_id = broker_id


class UnloadError(LifecycleError):
    """Unloading failed at ``step``; the WAL is intact and the topic unsealed. Retry
    ``unload`` to resume (a fenced topic cannot be sealed: see ``__cause__``)."""


class TopicNotHosted(LifecycleError, KeyError):
    def __init__(self, topic: TopicName) -> None:
        super().__init__(topic, "lookup", "not hosted on this broker")

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return Exception.__str__(self)


class TopicUnloading(LifecycleError):
    """An append arrived after unload began (or the topic was fenced/closed)."""


class ProduceTimeout(LifecycleError, TimeoutError):
    """The ack level was not reached in time; the message may still become durable."""

