"""Resolved global options of one ``dnb`` invocation, and opening the stores they name."""
from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tiered.tools.cli.output import EXIT_NOT_FOUND, CliError

_BROKER_ID_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


@dataclass(frozen=True)
class Settings:
    data_dir: str
    wal_dir: str
    metadata_url: str
    objects_url: str
    broker_id: str
    #: The whole configuration these came from, and where each key's value came from.
    loaded: Any = field(default=None, compare=False, repr=False)

    @property
    def config(self) -> Any:
        """The :class:`tiered.config.DnbConfig` in effect (defaults if none was loaded)."""
        from tiered.config import DnbConfig  # deferred: keeps `dnb --help` light

        return self.loaded.config if self.loaded is not None else DnbConfig()

    @classmethod
    def from_config(cls, loaded: Any) -> "Settings":
        """Settings from a :class:`tiered.config.LoadedConfig` (file < env < flags)."""
        config = loaded.config
        return cls.resolve(config.data_dir, config.wal_dir, config.metadata, config.objects, config.broker_id,
                           loaded=loaded)

    @classmethod
    def resolve(cls, data_dir: str, wal_dir: str | None = None, metadata: str | None = None,
                objects: str | None = None, broker_id: str | int = "1", loaded: Any = None) -> "Settings":
        """Fill defaults from the data dir and reject malformed values before touching anything."""
        data_dir = os.path.abspath(data_dir)
        settings = cls(
            data_dir=data_dir,
            wal_dir=os.path.abspath(wal_dir) if wal_dir else os.path.join(data_dir, "wal"),
            metadata_url=metadata or f"sqlite:///{os.path.join(data_dir, 'metadata.db').lstrip('/')}",
            objects_url=objects or f"file://{os.path.join(data_dir, 'objects')}",
            broker_id=str(broker_id),
            loaded=loaded,
        )
        settings.check()
        return settings

    def check(self) -> None:
        bid = self.broker_id
        if not bid or len(bid) > 128 or bid in (".", "..") or not set(bid) <= _BROKER_ID_CHARS:
            raise CliError(f"{self._label('broker_id', '--broker-id')} {bid!r} must be 1-128 characters "
                           "of [A-Za-z0-9._-]")
        _check_url(self._label("metadata", "--metadata"), self.metadata_url, ("sqlite", "etcd"),
                   "sqlite:///path/metadata.db or etcd://host:port[,host:port][/root]")
        _check_url(self._label("objects", "--objects"), self.objects_url, ("file", "s3"),
                   "file:///dir or s3://bucket/prefix")

    def _label(self, key: str, flag: str) -> str:
        """How to name a setting in an error: its flag, or its key and where it was set."""
        source = self.loaded.sources.get(key, "default") if self.loaded is not None else "flag"
        return flag if source.startswith("flag") or source == "default" else f"{key} (from {source})"

    def uses_local_files(self) -> bool:
        return self.metadata_url.startswith("sqlite:") or self.objects_url.startswith("file:")


def _check_url(option: str, url: str, schemes: tuple[str, ...], example: str) -> None:
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in schemes:
        raise CliError(f"{option} {redact_url(url)!r}: unknown scheme {scheme or '(none)'!r}; use {example}")


def redact_url(url: str) -> str:
    """``url`` without credentials (``user:pw@`` becomes ``***@``), safe for messages."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


@contextlib.contextmanager
def open_stores(settings: Settings, role: str = "command", check_objects: bool = True,
                create: bool = True) -> Iterator[tuple[object, object]]:
    """Open (metadata, objects) for one command (``role="command"``) or a broker process
    (``role="broker"``) and always close them again.

    An S3 store gets the ``[object_store]`` retry/timeout policy of its role and, unless
    ``object_store.check_bucket`` is off, its bucket is checked at once: a missing bucket
    (``BucketNotFound``) or an unreachable endpoint (``StorageUnavailable``, exit 4) fails
    here, before the command does anything. Commands that only read metadata pass
    ``check_objects=False`` (``inspect`` must work while the object store is down).
    Read-only commands pass ``create=False``: an embedded store that does not exist (a
    typo in ``--metadata`` or ``--data-dir``) is then an error, never created empty."""
    from tiered.metadata import open_metadata, sqlite_path  # deferred: keeps `dnb --help` light
    from tiered.objects import open_objects  # deferred: keeps `dnb --help` light

    if create and (settings.metadata_url.startswith("sqlite:") or settings.objects_url.startswith("file:")):
        os.makedirs(settings.data_dir, exist_ok=True)
    if create and settings.objects_url.startswith("file:"):
        os.makedirs(urllib.parse.unquote(urllib.parse.urlsplit(settings.objects_url).path), exist_ok=True)
    policy = settings.config.object_store
    s3 = settings.objects_url.startswith("s3:")
    objects = open_objects(settings.objects_url, **(policy.s3_options(role) if s3 else {}))
    try:
        path = sqlite_path(settings.metadata_url)
        if not create and path is not None and not os.path.exists(path):
            raise CliError(f"no metadata store at {path}, so no topic (this command only reads and creates "
                           "none; is --metadata or --data-dir right?)", EXIT_NOT_FOUND)
        metadata = open_metadata(settings.metadata_url)
        try:
            if policy.check_bucket and check_objects:
                objects.check()
            yield metadata, objects
        finally:
            metadata.close()
    finally:
        objects.close()
