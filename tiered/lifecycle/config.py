"""Configuration of a broker that hosts topics. Units are last in every name."""
from __future__ import annotations

from dataclasses import dataclass, field

from uploader.config import UploaderConfig
from wal.config import SECONDS_MAX, WalConfig

#: A lease is refreshed every third of its TTL; much shorter, one scheduling delay lapses it.
SESSION_TTL_S_MIN = 0.5


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything :class:`tiered.lifecycle.BrokerHost` needs besides its stores.

    ``wal_config`` is passed to ``WriteAheadLog.open`` for every hosted topic. The
    unload's drain is bounded by ``uploader.drain_timeout_s`` (the one drain bound).
    In a :class:`tiered.config.DnbConfig` both come from its ``wal`` and ``uploader``
    sections.
    """

    wal_config: WalConfig = field(default_factory=WalConfig)
    uploader: UploaderConfig = field(default_factory=UploaderConfig)
    # Liveness lease: other brokers take this broker's topics over only after it lapses.
    session_ttl_s: float = 10.0
    register_session: bool = True
    # Where clients reach this broker (e.g. http://10.0.0.7:8080), advertised in its
    # registration so lookup(topic) can redirect to the owner. None: not advertised.
    advertised_address: str | None = None
    # ``durable`` acks need more than this much of the session lease to be certain
    # (None: a third of session_ttl_s, i.e. two missed refreshes). A broker paused or cut
    # off stops acknowledging this long before its lease can lapse and its topics move.
    ack_lease_margin_s: float | None = None
    # The durable tip is published at most this often per topic, so a failover can
    # report how many offsets the dead owner never archived (see docs/LIFECYCLE.md).
    progress_interval_s: float = 1.0
    # Default bounds for producer waits and for each unload step (the drain step is
    # bounded by uploader.drain_timeout_s).
    produce_timeout_s: float = 30.0
    flush_timeout_s: float = 30.0
    close_timeout_s: float = 30.0
    # Whether a load may create a topic that does not exist yet (a produce or consume of a
    # new name creates it). Off: only an explicit create (``BrokerHost.create``, ``dnb
    # topic create``) does, and anything else gets TopicNotFound with nothing written.
    # A deleted topic is never re-created implicitly, whatever this says.
    auto_create: bool = True
    # A load of a topic whose open history is this broker id's own but whose WAL is not
    # in this WAL root (another data dir: a typo, the wrong disk): "refuse" raises
    # OwnHistoryElsewhere and writes nothing; "take_over" takes it over as a failover
    # would, recording its unarchived messages lost (for a broker whose disk was replaced
    # on purpose). ``load(..., accept_lost_own_history=True)`` accepts it for one load.
    own_history_elsewhere: str = "refuse"
    # Subscription cursor flush policy (passed to SubscriptionManager).
    cursor_flush_every_acks: int = 1000
    cursor_flush_interval_s: float = 5.0
    # Subscriptions a topic may have (stored cursors): any client can name a new one, and
    # each is kept for good, so a new one past this is refused (TooManySubscriptions).
    subscriptions_max: int = 10_000
    # Threads that run the background uploads of ALL hosted topics (one bounded pool
    # per host, so threads do not grow with the topic count). Seals drain on the
    # unloading thread, not in the pool. Each busy worker holds about two objects in
    # memory (uploader.object_target_bytes of frames and its encoding).
    upload_workers_max: int = 4
    # Metric cardinality of the host's registry (``wal.metrics.set_per_topic``): True one
    # series per topic, False one aggregated ``topic="_all"`` series (hosts of many
    # topics, docs/METRICS.md); None keeps the registry's choice (per topic unless set).
    # ``BrokerHost(metrics_per_topic=...)`` overrides it.
    metrics_per_topic: bool | None = None
    # Keep the state of loaded topics out of the cyclic garbage collector's full
    # collections (``wal.heap``): each load freezes what is alive, and at most once per
    # ``gc_refreeze_interval_s`` after loads or unloads one full collection reclaims the
    # cycles unloaded topics left. Off: the interpreter's default collector, whose full
    # collections walk every topic's objects (10-40 ms with the GIL held at 1,000 topics).
    gc_freeze: bool = True
    gc_refreeze_interval_s: float = 300.0
    # How often the host looks for hosted topics whose WAL failed on its own (a segment
    # write on a full disk) and reopens them from their files (``BrokerHost._revive_locked``).
    failed_wal_check_interval_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("session_ttl_s", "progress_interval_s", "produce_timeout_s",
                     "flush_timeout_s", "close_timeout_s", "cursor_flush_interval_s", "gc_refreeze_interval_s",
                     "failed_wal_check_interval_s"):
            if not 0 < getattr(self, name) <= SECONDS_MAX:
                raise ValueError(f"{name} must be > 0 and at most {SECONDS_MAX:.0e} s")
        if self.session_ttl_s < SESSION_TTL_S_MIN:
            raise ValueError(f"session_ttl_s must be at least {SESSION_TTL_S_MIN} s: a shorter lease lapses "
                             "between two refreshes (a third of it apart)")
        if self.ack_lease_margin_s is not None and not 0 <= self.ack_lease_margin_s < self.session_ttl_s:
            raise ValueError("ack_lease_margin_s must be in [0, session_ttl_s)")
        if self.cursor_flush_every_acks < 1:
            raise ValueError("cursor_flush_every_acks must be >= 1")
        if self.subscriptions_max < 1:
            raise ValueError("subscriptions_max must be >= 1")
        if self.own_history_elsewhere not in ("refuse", "take_over"):
            raise ValueError("own_history_elsewhere must be 'refuse' or 'take_over'")
        if self.upload_workers_max < 1:
            raise ValueError("upload_workers_max must be >= 1")

    @property
    def ack_margin_s(self) -> float:
        """The margin in effect (see ``ack_lease_margin_s``)."""
        return self.session_ttl_s / 3 if self.ack_lease_margin_s is None else self.ack_lease_margin_s
