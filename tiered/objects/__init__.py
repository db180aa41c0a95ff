"""Object stores: ``open_objects("file:///dir" | "s3://bucket/prefix[?endpoint=...]")``."""
from __future__ import annotations

import urllib.parse
from typing import Any

from tiered.errors import MissingDependency, UnknownScheme
from tiered.objects.base import (
    ByteRequest,
    Capabilities,
    ObjectInfo,
    ObjectStore,
    RangeByteRequest,
    SuffixByteRequest,
)

_S3_QUERY_OPTIONS = {
    "endpoint": ("endpoint_url", str),
    "region": ("region", str),
    "max_attempts": ("max_attempts", int),
    "connect_timeout_s": ("connect_timeout_s", float),
    "read_timeout_s": ("read_timeout_s", float),
    "multipart_threshold_bytes": ("multipart_threshold_bytes", int),
    "part_size_bytes": ("part_size_bytes", int),
}


def open_objects(url: str, **options: Any) -> ObjectStore:
    """Open an object store by URL; ``options`` go to the backend constructor.

    * ``file:///abs/dir``
    * ``s3://bucket[/prefix][?endpoint=http://host:port&region=...]``; without
      ``endpoint`` boto3 uses ``AWS_ENDPOINT_URL`` or AWS itself. An option in the URL
      wins over the same keyword in ``options`` (the URL is the more specific choice).
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "file":
        from tiered.objects.local import LocalObjectStore

        if parsed.netloc not in ("", "localhost") or not parsed.path:
            raise ValueError(f"file URL must look like file:///abs/dir (got {url!r})")
        return LocalObjectStore(urllib.parse.unquote(parsed.path), **options)
    if parsed.scheme == "s3":
        return _open_s3(parsed, options)
    raise UnknownScheme(
        f"unknown object-store URL scheme {parsed.scheme!r}: use file:///dir or s3://bucket/prefix"
    )


def _open_s3(parsed: urllib.parse.SplitResult, options: dict[str, Any]) -> ObjectStore:
    try:
        from tiered.objects.s3 import S3ObjectStore
    except ImportError as e:
        raise MissingDependency("the s3 backend needs `pip install boto3`") from e
    if not parsed.netloc or "@" in parsed.netloc:
        raise ValueError("s3 URL must look like s3://bucket/prefix (credentials come from the AWS chain)")
    for name, value in urllib.parse.parse_qsl(parsed.query):
        if name not in _S3_QUERY_OPTIONS:
            raise ValueError(f"unknown s3 URL option {name!r}; known: {sorted(_S3_QUERY_OPTIONS)}")
        arg, kind = _S3_QUERY_OPTIONS[name]
        try:
            converted = kind(value)
        except ValueError as e:
            raise ValueError(f"s3 URL option {name}={value!r} is not a valid {kind.__name__}") from e
        if kind in (int, float) and not converted > 0:
            raise ValueError(f"s3 URL option {name}={value!r} must be > 0")
        options[arg] = converted
    return S3ObjectStore(parsed.netloc, parsed.path.strip("/"), **options)


__all__ = [
    "ByteRequest", "Capabilities", "ObjectInfo", "ObjectStore", "RangeByteRequest", "SuffixByteRequest",
    "open_objects",
]  # fmt: skip
