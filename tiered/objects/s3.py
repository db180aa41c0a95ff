"""Object store on S3 or an S3-compatible server (``s3://bucket/prefix``) via boto3.

* Credentials come from boto3's normal chain (env, profile, instance role); they
  are never logged or put into errors.
* Endpoint: ``endpoint_url`` argument, else ``AWS_ENDPOINT_URL`` (boto3 reads it).
* Every call is bounded: explicit connect/read timeouts and botocore "standard"
  retries (exponential backoff with jitter on throttling, 5xx and timeouts) with
  ``max_attempts``. After that the caller gets a typed, retryable error.
* Objects larger than ``multipart_threshold_bytes`` go up as a multipart upload
  (parts in parallel, bounded by ``upload_threads_max``), aborted on failure so no
  half object is visible. ``if_absent`` uses ``IfNoneMatch='*'`` on the single PUT
  or on ``CompleteMultipartUpload``.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError as BotoConnectionError
from botocore.exceptions import ConnectTimeoutError, NoCredentialsError, ReadTimeoutError

from tiered.errors import (
    InvalidRange,
    ObjectNotFound,
    OperationTimeout,
    PermissionDenied,
    PreconditionFailed,
    StorageError,
    StorageUnavailable,
)
from tiered.objects.base import Capabilities, Data, ObjectInfo, ObjectStore, check_key, check_prefix, check_range

log = logging.getLogger(__name__)

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_PRECONDITION = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_DENIED = {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
_RANGE = {"InvalidRange", "416"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable", "InternalError", "503", "500"}


class S3ObjectStore(ObjectStore):
    """Objects under ``s3://bucket/prefix``. See the module docstring."""

    capabilities = Capabilities(conditional_put=True, atomic_put=True, multipart=True)

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
        client=None,
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
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            max_pool_connections=max(10, upload_threads_max * 2),
        )
        self._client = client or boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region, config=config
        )
        self.endpoint = self._client.meta.endpoint_url

    def _full(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    # -- writes ------------------------------------------------------------
    def put(self, key: str, data: Data, if_absent: bool = False) -> ObjectInfo:
        full = self._full(key)
        size = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else os.path.getsize(data)
        extra = {"IfNoneMatch": "*"} if if_absent else {}
        with self._mapped(key, "put"):
            if size > self.multipart_threshold_bytes:
                etag = self._put_multipart(full, data, size, extra)
            else:
                body = data if isinstance(data, (bytes, bytearray, memoryview)) else _read_file(data)
                etag = self._client.put_object(Bucket=self.bucket, Key=full, Body=bytes(body), **extra)["ETag"]
        return ObjectInfo(key, size, etag.strip('"'), 0.0)

    def _put_multipart(self, full: str, data: Data, size: int, extra: dict) -> str:
        upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=full)["UploadId"]
        try:
            offsets = range(0, size, self.part_size_bytes)

            def upload(number_offset: tuple[int, int]) -> dict:
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
            return resp["ETag"]
        except BaseException:
            # Best effort: an unfinished upload is invisible but costs storage.
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            raise

    def delete(self, key: str) -> None:
        with self._mapped(key, "delete"):
            self._client.delete_object(Bucket=self.bucket, Key=self._full(key))

    # -- reads -------------------------------------------------------------
    def get(self, key: str) -> bytes:
        with self._mapped(key, "get"):
            return self._client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"].read()

    def get_range(self, key: str, start: int, end_inclusive: int) -> bytes:
        check_range(start, end_inclusive)
        with self._mapped(key, "get_range"):
            resp = self._client.get_object(Bucket=self.bucket, Key=self._full(key), Range=f"bytes={start}-{end_inclusive}")
            return resp["Body"].read()

    def get_suffix(self, key: str, length: int) -> bytes:
        if length < 0:
            raise ValueError(f"suffix length must be >= 0, got {length}")
        if length == 0:
            self.head(key)  # same not-found behaviour as a real read
            return b""
        with self._mapped(key, "get_suffix"):
            resp = self._client.get_object(Bucket=self.bucket, Key=self._full(key), Range=f"bytes=-{length}")
            return resp["Body"].read()

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
            raise _map_client_error(e, where, what) from e
        except (ConnectTimeoutError, ReadTimeoutError) as e:
            raise OperationTimeout(f"{what} {where}: timed out ({self.endpoint})") from e
        except NoCredentialsError as e:
            raise PermissionDenied(f"{what} {where}: no AWS credentials found (env, profile or role)") from e
        except BotoConnectionError as e:
            raise StorageUnavailable(f"{what} {where}: cannot reach {self.endpoint}") from e
        except BotoCoreError as e:
            raise StorageError(f"{what} {where}: {type(e).__name__}") from e


def _map_client_error(e: ClientError, where: str, what: str) -> StorageError:
    error = e.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    text = f"{what} {where}: {code or status}"
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
