"""Configuration of a broker that hosts topics. Units are last in every name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from uploader.config import UploaderConfig


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything :class:`tiered.lifecycle.BrokerHost` needs besides its stores.

    ``wal_config`` is passed through to ``WriteAheadLog.open`` (None = its defaults).
    """

    wal_config: Any = None
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
    # Default bounds for producer waits and for each unload step.
    produce_timeout_s: float = 30.0
    flush_timeout_s: float = 30.0
    drain_timeout_s: float = 120.0
    close_timeout_s: float = 30.0
    # Subscription cursor flush policy (passed to SubscriptionManager).
    cursor_flush_every_acks: int = 1000
    cursor_flush_interval_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("session_ttl_s", "progress_interval_s", "produce_timeout_s",
                     "flush_timeout_s", "drain_timeout_s", "close_timeout_s", "cursor_flush_interval_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.ack_lease_margin_s is not None and not 0 <= self.ack_lease_margin_s < self.session_ttl_s:
            raise ValueError("ack_lease_margin_s must be in [0, session_ttl_s)")
        if self.cursor_flush_every_acks < 1:
            raise ValueError("cursor_flush_every_acks must be >= 1")

    @property
    def ack_margin_s(self) -> float:
        """The margin in effect (see ``ack_lease_margin_s``)."""
        return self.session_ttl_s / 3 if self.ack_lease_margin_s is None else self.ack_lease_margin_s
