"""Configuration of the ``dnb broker run`` process (the ``[server]`` config section)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BrokerProcessConfig:
    """The ``[server]`` section: where the HTTP API listens, how long shutdown may take,
    and what this broker's machine can carry (reported in its load reports).

    The address clients use is ``BrokerConfig.advertised_address`` (one key, not two);
    when it is None the process advertises ``http://<listen_host>:<listen_port>``.
    ``nic_bps`` (each direction) and ``disk_bps`` are bytes per second; None reports them
    unknown, and the weighted_load strategy then measures this broker's network and disk
    use against the busiest broker's instead of against its capacity.
    """

    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    shutdown_timeout_s: float = 120.0
    nic_bps: float | None = None
    disk_bps: float | None = None

    def __post_init__(self) -> None:
        if not self.listen_host:
            raise ValueError("listen_host must not be empty")
        if isinstance(self.listen_port, bool) or not 0 <= self.listen_port <= 65535:
            raise ValueError(f"listen_port must be in 0..65535, got {self.listen_port!r}")
        if self.shutdown_timeout_s <= 0:
            raise ValueError("shutdown_timeout_s must be > 0")
        for name in ("nic_bps", "disk_bps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0 or value == float("inf")):
                raise ValueError(f"{name} must be a number of bytes per second > 0, got {value!r}")
