"""How an S3 object store retries and times out: :class:`ObjectStoreConfig` (the
``[object_store]`` section of the configuration).

A long-lived broker and a one-shot ``dnb`` command want different answers to an
unreachable endpoint: the broker rides out a blip (more attempts, a longer connect
timeout, the uploader retries anyway), a command should fail within about a second so
its operator sees the cause. Unset values take the default of the role the store is
opened for; a value in the objects URL (``?max_attempts=…``) wins over both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["broker", "command"]

#: (max_attempts, connect_timeout_s) when the config leaves them unset.
ROLE_DEFAULTS: dict[str, tuple[int, float]] = {"broker": (5, 3.0), "command": (2, 1.0)}


@dataclass(frozen=True, slots=True)
class ObjectStoreConfig:
    #: Attempts per S3 call (first try included); None: 5 in a broker, 2 in a command.
    max_attempts: int | None = None
    #: Seconds to wait for a TCP connection; None: 3 in a broker, 1 in a command.
    connect_timeout_s: float | None = None
    #: Seconds to wait for a response once connected.
    read_timeout_s: float = 30.0
    #: HEAD the bucket when the store is opened: a missing bucket or an unreachable
    #: endpoint fails the start instead of the first upload.
    check_bucket: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (not isinstance(self.max_attempts, int) or self.max_attempts < 1):
            raise ValueError(f"max_attempts must be a whole number >= 1 (got {self.max_attempts!r})")
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 (got {value!r})")

    def s3_options(self, role: Role) -> dict[str, Any]:
        """Keyword arguments for ``open_objects`` of an ``s3://`` URL in ``role``."""
        attempts, connect = ROLE_DEFAULTS[role]
        return {
            "max_attempts": attempts if self.max_attempts is None else self.max_attempts,
            "connect_timeout_s": connect if self.connect_timeout_s is None else self.connect_timeout_s,
            "read_timeout_s": self.read_timeout_s,
        }
