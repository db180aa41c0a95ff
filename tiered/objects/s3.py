"""Object store on S3 or an S3-compatible server (``s3://bucket/prefix``) via boto3.

* Credentials come from boto3's normal chain (env, profile, instance role); they
  are never logged or put into errors.
* Endpoint: ``endpoint_url`` argument, else ``AWS_ENDPOINT_URL`` (boto3 reads it).
* Every call is bounded: explicit connect/read timeouts and botocore "standard"
  retries (exponential backoff with jitter on throttling, 5xx and timeouts) with
  ``max_attempts``. After that the caller gets a typed, retryable error. The defaults
  suit a long-lived broker; a one-shot command passes fewer attempts and a shorter
  connect timeout (``tiered.objects.config.ObjectStoreConfig``) so an unreachable
  endpoint fails it in about a second.
* :meth:`S3ObjectStore.check` (HEAD bucket; the CLI and ``dnb broker run`` call it when
  they open the store): a missing bucket is :class:`BucketNotFound` naming bucket and
  endpoint, an unreachable endpoint :class:`StorageUnavailable`. Any other call on a
  missing bucket raises :class:`BucketNotFound` too.
* Objects larger than ``multipart_threshold_bytes`` go up as a multipart upload
  (parts in parallel, bounded by ``upload_threads_max``), aborted on failure so no
  half object is visible. ``if_absent`` uses ``IfNoneMatch='*'`` on the single PUT
  or on ``CompleteMultipartUpload``.
* Conditional puts are probed, not assumed: before the first ``put(if_absent=True)`` (or
  when ``capabilities`` is first read) the store PUTs a probe key twice with
  ``If-None-Match: *``. A server that accepts the second PUT ignores the header (older
  MinIO and Ceph, some proxies, s3rver): that is logged once as a warning, exposed as
  ``conditional_put_honoured`` / ``capabilities.conditional_put`` and, with a
  ``metrics_registry``, the gauge ``dnb_object_store_conditional_put_honoured``. Nothing
  relies on the header for safety (archive keys carry the writer's epoch, so no two
  writers share a key); it stays an extra guard.
* Every ranged GET's ``Content-Range`` is checked against what was asked. A server that
  ignores the range (200, whole object) is sliced locally; one that answers a different
  range is a ``StorageError``. A suffix range (``bytes=-N``) answered with other bytes
  (s3rver returns the first N) switches this store to HEAD + explicit range for good,
  logged once.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError as BotoConnectionError
from botocore.exceptions import ConnectTimeoutError, NoCredentialsError, ReadTimeoutError
from prometheus_client import CollectorRegistry, Gauge

from tiered.errors import (
    BucketNotFound,
    InvalidRange,
    ObjectNotFound,
    OperationTimeout,
    PermissionDenied,
    PreconditionFailed,
    StorageError,
    StorageUnavailable,
)
from tiered.objects.base import (
    DELETE_MANY_MAX,
    ByteRequest,
    Capabilities,
    Data,
    ObjectInfo,
    ObjectStore,
    RangeByteRequest,
    SuffixByteRequest,
    check_byte_request,
    check_key,
    check_prefix,
)

log = logging.getLogger(__name__)

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_PRECONDITION = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_DENIED = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
_RANGE = {"InvalidRange", "416"}
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
#: Where the conditional-put probe writes (and at once deletes) its key, under the prefix.
PROBE_KEY_PREFIX = ".dnb-probe/"
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable", "InternalError", "503", "500"}


class S3ObjectStore(ObjectStore):
    """Objects under ``s3://bucket/prefix``. See the module docstring."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_attempts: int = 5,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 30.0,
        multipart_threshold_bytes: int = 16 << 20,
        part_size_bytes: int = 8 << 20,
        upload_threads_max: int = 4,
        client: Any = None,  # a boto3 S3 client (boto3 ships no type information)
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        if part_size_bytes < 5 << 20:
            raise ValueError("S3 parts must be at least 5 MiB")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        if self.prefix:
            check_key(self.prefix.rstrip("/"))
        self.multipart_threshold_bytes = multipart_threshold_bytes
        self.part_size_bytes = part_size_bytes
        self.upload_threads_max = upload_threads_max
        config = Config(
            # botocore's "max_attempts" counts retries (one more attempt in all);
            # "total_max_attempts" counts attempts, the first included, as ours does.
            retries={"total_max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            max_pool_connections=max(10, upload_threads_max * 2),
        )
        self._client = client or boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )
        self.endpoint = self._client.meta.endpoint_url
        self._probe_lock = threading.Lock()
        self._conditional_put_honoured: bool | None = None  # None: not probed yet
        self._suffix_ranges_ok = True
        self._honoured_gauge = None if metrics_registry is None else Gauge(
            "dnb_object_store_conditional_put_honoured",
            "1 when the S3 server refuses a second If-None-Match:* PUT of a key, 0 when it ignores "
            "the header (probed once per store)", ["bucket"], registry=metrics_registry)

    # -- what the server really does -----------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        """Probed on first use; ``conditional_put`` is False while the server is unprobed
        because it cannot be reached (unknown is not a promise)."""
        honoured = self._conditional_put_honoured
        if honoured is None:
            try:
                honoured = self.probe_conditional_put()
            except StorageError as e:
                log.warning("%r: cannot probe conditional puts yet: %s", self, e)
        return Capabilities(conditional_put=honoured is True, atomic_put=True, multipart=True)

    @property
    def conditional_put_honoured(self) -> bool | None:
        """What the probe found (None: not probed yet). Never probes by itself."""
        return self._conditional_put_honoured

    def probe_conditional_put(self) -> bool:
        """PUT a fresh probe key twice with ``If-None-Match: *``: True when the second PUT
        is refused. Runs once per store; the probe key is deleted afterwards."""
        with self._probe_lock:
            if self._conditional_put_honoured is not None:
                return self._conditional_put_honoured
            key = f"{PROBE_KEY_PREFIX}conditional-put-{uuid.uuid4().hex}"
            full = self._full(key)
            try:
                with self._mapped(key, "probe"):
                    self._client.put_object(Bucket=self.bucket, Key=full, Body=b"1", IfNoneMatch="*")
                try:
                    with self._mapped(key, "probe"):
                        self._client.put_object(Bucket=self.bucket, Key=full, Body=b"2", IfNoneMatch="*")
                    honoured = False
                except PreconditionFailed:
                    honoured = True
            finally:
                with contextlib.suppress(StorageError):
                    self.delete(key)
            self._conditional_put_honoured = honoured
            if self._honoured_gauge is not None:
                self._honoured_gauge.labels(self.bucket).set(1 if honoured else 0)
            if honoured:
                log.info("%r: the server honours If-None-Match on PUT", self)
            else:
                log.warning("%r: the server IGNORES If-None-Match on PUT (a conditional put overwrites); "
                            "archive safety does not depend on it (keys carry the writer's epoch)", self)
            return honoured

    def _full(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    # -- writes ------------------------------------------------------------
    def put(self, key: str, data: Data, if_absent: bool = False) -> ObjectInfo:
        full = self._full(key)
        if if_absent and self._conditional_put_honoured is None:
            self.probe_conditional_put()
        size = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else os.path.getsize(data)
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        with self._mapped(key, "put"):
            if size > self.multipart_threshold_bytes:
                etag = self._put_multipart(full, data, size, extra)
            else:
                body = data if isinstance(data, (bytes, bytearray, memoryview)) else _read_file(data)
                etag = self._client.put_object(Bucket=self.bucket, Key=full, Body=bytes(body), **extra)["ETag"]
        return ObjectInfo(key, size, etag.strip('"'), 0.0)

    def _put_multipart(self, full: str, data: Data, size: int, extra: dict[str, str]) -> str:
        upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=full)["UploadId"]
        try:
            offsets = range(0, size, self.part_size_bytes)

            def upload(number_offset: tuple[int, int]) -> dict[str, int | str]:
                number, offset = number_offset
                body = _slice(data, offset, min(self.part_size_bytes, size - offset))
                resp = self._client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body
                )
                return {"PartNumber": number, "ETag": resp["ETag"]}

            with ThreadPoolExecutor(self.upload_threads_max, thread_name_prefix="s3-part") as pool:
                parts = list(pool.map(upload, enumerate(offsets, start=1)))
            resp = self._client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}, **extra
            )
            etag: str = resp["ETag"]
            return etag
        except BaseException:
            # Best effort: an unfinished upload is invisible but costs storage.
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            raise

    def delete(self, key: str) -> None:
        with self._mapped(key, "delete"):
            self._client.delete_object(Bucket=self.bucket, Key=self._full(key))

    def delete_many(self, keys: Sequence[str]) -> None:
        """One ``DeleteObjects`` request (quiet: only failures are answered); a key that
        failed raises, naming the first failure, after the others were deleted."""
        if len(keys) > DELETE_MANY_MAX:
            raise ValueError(f"delete_many takes at most {DELETE_MANY_MAX} keys, got {len(keys)}")
        if not keys:
            return
        with self._mapped(keys[0], "delete_many"):
            resp = self._client.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": self._full(k)} for k in keys], "Quiet": True})
        errors = resp.get("Errors") or []
        if errors:
            first = errors[0]
            raise StorageError(f"delete_many {self._where(keys[0])}: {len(errors)} of {len(keys)} keys not deleted, "
                               f"first {first.get('Key')}: {first.get('Code')} {first.get('Message')} ({self.endpoint})")

    # -- reads -------------------------------------------------------------
    def get(self, key: str) -> bytes:
        with self._mapped(key, "get"):
            body: bytes = self._client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"].read()
            return body

    def get_range(self, key: str, byte_range: ByteRequest) -> bytes:
        check_byte_request(byte_range)
        if isinstance(byte_range, SuffixByteRequest):
            return self.get_tail(key, byte_range.suffix)[0]
        start, end_inclusive = byte_range.start, byte_range.end - 1  # HTTP ranges are inclusive
        data, first, total = self._ranged_get(key, "get_range", f"bytes={start}-{end_inclusive}")
        if first is None:  # the server sent the whole object
            if start >= total:
                raise InvalidRange(f"get_range {self._where(key)}: start {start} is past the end ({total} bytes)")
            return data[start:byte_range.end]
        if (first, first + len(data) - 1) != (start, min(end_inclusive, total - 1)):
            raise StorageError(f"get_range {self._where(key)}: asked for bytes {start}-{end_inclusive}, the "
                               f"server answered {first}-{first + len(data) - 1} of {total} ({self.endpoint})")
        return data

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        if length < 0:
            raise ValueError(f"suffix length must be >= 0, got {length}")
        if length == 0:
            return b"", self.head(key).size  # same not-found behaviour as a real read
        if self._suffix_ranges_ok:
            data, first, total = self._ranged_get(key, "get_suffix", f"bytes=-{length}")
            if first is None:  # the whole object
                return data[-length:], total
            if first == max(0, total - length) and first + len(data) == total:
                return data, total
            self._suffix_ranges_ok = False
            log.warning("%r: the server answered the suffix range bytes=-%d of %s with bytes %d-%d of %d; "
                        "using HEAD + explicit ranges from now on", self, length, key, first,
                        first + len(data) - 1, total)
        else:
            total = self.head(key).size
        if total == 0:
            return b"", 0
        return self.get_range(key, RangeByteRequest(max(0, total - length), total)), total

    def _ranged_get(self, key: str, what: str, byte_range: str) -> tuple[bytes, int | None, int]:
        """(body, first byte position or None when the server sent the whole object, total size)."""
        with self._mapped(key, what):
            resp = self._client.get_object(Bucket=self.bucket, Key=self._full(key), Range=byte_range)
            data = resp["Body"].read()
        content_range = resp.get("ContentRange")
        if not content_range:
            if resp.get("ResponseMetadata", {}).get("HTTPStatusCode") == 206:
                raise StorageError(f"{what} {self._where(key)}: 206 without Content-Range ({self.endpoint})")
            return data, None, len(data)
        match = _CONTENT_RANGE_RE.fullmatch(content_range.strip())
        if match is None:
            raise StorageError(f"{what} {self._where(key)}: unusable Content-Range {content_range!r}")
        first, last, total = (int(g) for g in match.groups())
        if last < first or last >= total or len(data) != last - first + 1:
            raise StorageError(f"{what} {self._where(key)}: Content-Range {content_range!r} does not match "
                               f"the {len(data)} bytes received ({self.endpoint})")
        return data, first, total

    def head(self, key: str) -> ObjectInfo:
        with self._mapped(key, "head"):
            resp = self._client.head_object(Bucket=self.bucket, Key=self._full(key))
        return ObjectInfo(key, resp["ContentLength"], resp["ETag"].strip('"'), resp["LastModified"].timestamp())

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        paginator = self._client.get_paginator("list_objects_v2")
        with self._mapped(prefix, "list"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                for item in page.get("Contents", []):
                    yield ObjectInfo(
                        item["Key"][len(self.prefix):],
                        item["Size"],
                        item["ETag"].strip('"'),
                        item["LastModified"].timestamp(),
                    )

    def check(self) -> None:
        """HEAD the bucket: :class:`BucketNotFound` when it does not exist at the endpoint,
        :class:`StorageUnavailable` when the endpoint cannot be reached (within this
        store's attempts and connect timeout), :class:`PermissionDenied` when refused."""
        try:
            with self._mapped("", "check bucket"):
                self._client.head_bucket(Bucket=self.bucket)
        except ObjectNotFound as e:  # a HEAD answer has no body: a missing bucket is a bare 404
            raise self._bucket_not_found() from e.__cause__

    def _bucket_not_found(self) -> BucketNotFound:
        return BucketNotFound(f"bucket {self.bucket!r} does not exist at {self.endpoint} "
                              "(create it, or fix the bucket or endpoint of the objects URL)")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()

    def __repr__(self) -> str:
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix}, endpoint={self.endpoint!r})"

    # -- errors ------------------------------------------------------------
    @contextlib.contextmanager
    def _mapped(self, key: str, what: str) -> Iterator[None]:
        """Map botocore errors onto the hierarchy, keeping the cause."""
        where = self._where(key)
        try:
            yield
        except ClientError as e:
            raise _map_client_error(e, where, what, self) from e
        except (ConnectTimeoutError, ReadTimeoutError) as e:
            raise OperationTimeout(f"{what} {where}: timed out ({self.endpoint})") from e
        except NoCredentialsError as e:
            raise PermissionDenied(f"{what} {where}: no AWS credentials found (env, profile or role)") from e
        except BotoConnectionError as e:
            raise StorageUnavailable(f"{what} {where}: cannot reach {self.endpoint}") from e
        except BotoCoreError as e:
            raise StorageError(f"{what} {where}: {type(e).__name__}") from e


def _map_client_error(e: ClientError, where: str, what: str, store: S3ObjectStore) -> StorageError:
    error = e.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    text = f"{what} {where}: {code or status}"
    if code == "NoSuchBucket":
        return store._bucket_not_found()
    if code in _NOT_FOUND or (status == "404" and code != "NoSuchBucket"):
        return ObjectNotFound(f"{text}: not found")
    if code in _PRECONDITION or status == "412":
        return PreconditionFailed(f"{text}: precondition failed (object exists or changed)")
    if code in _DENIED or status == "403":
        return PermissionDenied(f"{text}: permission denied")
    if code in _RANGE or status == "416":
        return InvalidRange(f"{text}: range not satisfiable")
    if code in _THROTTLED or status.startswith("5"):
        return StorageUnavailable(f"{text}: server busy or failing (retries exhausted)")
    return StorageError(text)


def _read_file(path: os.PathLike[str] | str) -> bytes:
    with open(os.fspath(path), "rb") as f:
        return f.read()


def _slice(data: Data, offset: int, length: int) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(memoryview(data)[offset:offset + length])
    with open(os.fspath(data), "rb") as f:
        f.seek(offset)
        return f.read(length)
