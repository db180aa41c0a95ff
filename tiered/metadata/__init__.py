"""Metadata stores: ``open_metadata("sqlite:///path.db" | "etcd://h:p[,h:p][/root]")``."""
from __future__ import annotations

import urllib.parse
from typing import Any

from tiered.errors import MissingDependency, UnknownScheme
from tiered.metadata.base import (
    Compare,
    Delete,
    DeleteEvent,
    Event,
    Get,
    KeyValue,
    Lease,
    MetadataStore,
    Op,
    Put,
    PutEvent,
    TxnResult,
    Watch,
    absent,
    create_revision_is,
    mod_revision_is,
    value_is,
    version_is,
)

_ETCD_QUERY_OPTIONS = {"timeout_s": float, "endpoint_retry_s": float, "ca_cert": str, "cert_cert": str, "cert_key": str}


def sqlite_path(url: str) -> str | None:
    """The database file a ``sqlite:`` URL names (None for another scheme)."""
    parsed = urllib.parse.urlsplit(url)
    return parsed.netloc + parsed.path if parsed.scheme == "sqlite" else None


def open_metadata(url: str, **options: Any) -> MetadataStore:
    """Open a metadata store by URL; ``options`` go to the backend constructor.

    * ``sqlite:///abs/path/metadata.db`` (``sqlite://rel/path.db`` is relative)
    * ``etcd://host:port[,host:port...][/root][?timeout_s=5&ca_cert=...]``;
      ``etcd://user:password@host:port`` or ``user=``/``password=`` options for auth.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "sqlite":
        from tiered.metadata.sqlite import SqliteMetadataStore

        path = sqlite_path(url)
        if not path:
            raise ValueError(f"sqlite URL needs a path, e.g. sqlite:///var/lib/dnb/metadata.db (got {url!r})")
        return SqliteMetadataStore(path, **options)
    if parsed.scheme == "etcd":
        return _open_etcd(parsed, options)
    raise UnknownScheme(
        f"unknown metadata URL scheme {parsed.scheme!r}: use sqlite:///path/metadata.db "
        "or etcd://host:port[,host:port][/root]"
    )


def _open_etcd(parsed: urllib.parse.SplitResult, options: dict[str, Any]) -> MetadataStore:
    try:
        from tiered.metadata.etcd import EtcdMetadataStore
    except ImportError as e:
        raise MissingDependency(
            "the etcd backend needs `pip install etcd-sdk-python==0.0.7 'protobuf>=5.27.2'`"
        ) from e
    userinfo, _, hosts = parsed.netloc.rpartition("@")
    if userinfo:
        user, _, password = userinfo.partition(":")
        options.setdefault("user", urllib.parse.unquote(user))
        options.setdefault("password", urllib.parse.unquote(password))
    endpoints = []
    for hostport in hosts.split(","):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"etcd endpoint {hostport!r} must look like host:port")
        endpoints.append((host, int(port)))
    for name, value in urllib.parse.parse_qsl(parsed.query):
        if name not in _ETCD_QUERY_OPTIONS:
            raise ValueError(f"unknown etcd URL option {name!r}; known: {sorted(_ETCD_QUERY_OPTIONS)}")
        options.setdefault(name, _ETCD_QUERY_OPTIONS[name](value))
    root = parsed.path.rstrip("/")
    return EtcdMetadataStore(endpoints, root=root, **options)


__all__ = [
    "Compare", "Delete", "DeleteEvent", "Event", "Get", "KeyValue", "Lease", "MetadataStore", "Op",
    "Put", "PutEvent", "TxnResult", "Watch", "absent", "create_revision_is", "mod_revision_is",
    "open_metadata", "sqlite_path", "value_is", "version_is",
]  # fmt: skip
