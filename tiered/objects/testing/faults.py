"""Fault injection for object stores; see :mod:`tiered.metadata.testing.faults` for the plan API.

Besides errors, timeouts and latency, ``faults.tear("put")`` makes a put store only
the first half of the data under the final key and then raise
:class:`~tiered.errors.StorageUnavailable`, mimicking a store without atomic puts
(or a reader racing a non-atomic copy) so readers' validation can be tested.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

from tiered.errors import StorageUnavailable
from tiered.metadata.testing.faults import FaultPlan
from tiered.objects.base import ByteRequest, Capabilities, Data, ObjectInfo, ObjectStore, SuffixByteRequest


class FaultyObjectStore(ObjectStore):
    def __init__(self, inner: ObjectStore, plan: FaultPlan | None = None) -> None:
        self.inner = inner
        self.faults = plan or FaultPlan()
        #: While True every put overwrites, as on a server that ignores If-None-Match
        #: (older MinIO and Ceph, some proxies): safety must not depend on it.
        self.ignore_conditional_put = False

    @property
    def capabilities(self) -> Capabilities:  # the inner store's, as it knows them now (S3 probes its server)
        return self.inner.capabilities

    def put(self, key: str, data: Data, if_absent: bool = False) -> ObjectInfo:
        if_absent = if_absent and not self.ignore_conditional_put
        fault = self.faults.next_fault("put")
        if fault is None:
            return self.inner.put(key, data, if_absent)
        if fault.kind == "tear":
            body = data if isinstance(data, (bytes, bytearray, memoryview)) else _read(data)
            self.inner.put(key, bytes(body[: len(body) // 2]), if_absent)
            raise StorageUnavailable(f"injected fault: torn put of {key!r}")
        return self.faults.apply("put", fault, lambda: self.inner.put(key, data, if_absent))

    def get(self, key: str) -> bytes:
        return self.faults.run("get", lambda: self.inner.get(key))

    def get_range(self, key: str, byte_range: ByteRequest) -> bytes:
        # A suffix is planned under "get_suffix", an explicit range under "get_range".
        op = "get_suffix" if isinstance(byte_range, SuffixByteRequest) else "get_range"
        return self.faults.run(op, lambda: self.inner.get_range(key, byte_range))

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        # Planned under "get_suffix": it is the same request for every backend that can.
        return self.faults.run("get_suffix", lambda: self.inner.get_tail(key, length))

    def head(self, key: str) -> ObjectInfo:
        return self.faults.run("head", lambda: self.inner.head(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.faults.run("list", lambda: iter(list(self.inner.list(prefix))))

    def delete(self, key: str) -> None:
        return self.faults.run("delete", lambda: self.inner.delete(key))

    def close(self) -> None:
        self.inner.close()


def _read(path: os.PathLike[str] | str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
