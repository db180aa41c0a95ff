"""The one configuration object: :class:`DnbConfig`, composed of every layer's section.

Each layer keeps its own frozen dataclass (``wal.config.WalConfig``,
``uploader.config.UploaderConfig``, ``tiered.lifecycle.config.BrokerConfig``, ...) and
validates its own values; this module only puts them side by side, so a config file
mirrors the code one to one: ``[wal]`` is a ``WalConfig``, ``[uploader.retention]`` a
``RetentionConfig``, and so on. Loading (file, env, flags) is in :mod:`tiered.config.loader`.

Units: every duration is in seconds and its name ends in ``_s``; every size is in
bytes and its name says ``bytes``. No key is in milliseconds, minutes or MiB.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from tiered.broker.config import BrokerProcessConfig
from tiered.cluster.config import LoadManagerConfig
from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle.watcher import WatcherConfig
from tiered.objects.config import ObjectStoreConfig
from uploader.config import UploaderConfig
from wal.config import WalConfig


@dataclass(frozen=True, slots=True)
class DnbConfig:
    """Everything one broker process (or one ``dnb`` command) is configured with.

    The five top-level keys are the CLI's global options (``--broker-id``,
    ``--data-dir``, ``--wal-dir``, ``--metadata``, ``--objects``) and keep their
    environment variables (``DNB_BROKER_ID``, ``DNB_DATA_DIR``, ``DNB_WAL_DIR``,
    ``DNB_METADATA``, ``DNB_OBJECTS``). ``None`` for a path or URL means "derived from
    ``data_dir``" (see docs/CONFIG.md).

    ``broker`` holds the lifecycle settings only: its ``wal_config`` and ``uploader``
    fields are the ``wal`` and ``uploader`` sections, joined by :meth:`broker_config`,
    so each value has exactly one key.
    """

    broker_id: str = "1"
    data_dir: str = "./dnb-data"
    wal_dir: str | None = None
    metadata: str | None = None
    objects: str | None = None
    wal: WalConfig = field(default_factory=WalConfig)
    uploader: UploaderConfig = field(default_factory=UploaderConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    watcher: WatcherConfig = field(default_factory=WatcherConfig)
    server: BrokerProcessConfig = field(default_factory=BrokerProcessConfig)
    load_manager: LoadManagerConfig = field(default_factory=LoadManagerConfig)
    object_store: ObjectStoreConfig = field(default_factory=ObjectStoreConfig)

    def __post_init__(self) -> None:
        for name in ("broker_id", "data_dir"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        for name in ("wal_dir", "metadata", "objects"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string (or absent: derived from data_dir)")
        # A second copy of a section inside ``broker`` would be a second key for the
        # same value; refuse it instead of picking one silently.
        if self.broker.wal_config != WalConfig():
            raise ValueError("set the WAL through the wal section, not broker.wal_config")
        if self.broker.uploader != UploaderConfig():
            raise ValueError("set the uploader through the uploader section, not broker.uploader")

    def broker_config(self) -> BrokerConfig:
        """The :class:`BrokerConfig` a :class:`~tiered.lifecycle.BrokerHost` takes."""
        return replace(self.broker, wal_config=self.wal, uploader=self.uploader)
