"""What one archive retention cut costs: a topic with N committed descriptors (small
objects, written directly), cut to its last descriptor by ``bytes_max=0``.

Measured per store: the run's wall time, metadata transactions (1 to raise the start +
one per 64 descriptor deletes), and per-descriptor cost; then a second run (nothing to
cut: one paged read of the chain) and a run with retention off (the cheap check every
uploader does at its interval: one get + one single-key range).

    .venv/bin/python bench/bench_archive_retention.py              # SQLite + local dir
    .venv/bin/python bench/bench_archive_retention.py --servers   # + a private etcd and moto
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from prometheus_client import CollectorRegistry  # noqa: E402

from tiered.archive.naming import object_id_for, object_key  # noqa: E402
from tiered.metadata import keys, open_metadata  # noqa: E402
from tiered.metadata.base import value_is  # noqa: E402
from tiered.objects import open_objects  # noqa: E402
from uploader.archive_retention import ArchiveRetention  # noqa: E402
from uploader.config import ArchiveRetentionConfig  # noqa: E402
from uploader.metrics import UploaderMetrics  # noqa: E402

TOPIC = "/bench/retention"


class CountingStore:
    """The metadata store, counting transactions."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.txns = 0

    def txn(self, *args: object, **kwargs: object) -> object:
        self.txns += 1
        return self.inner.txn(*args, **kwargs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def build(metadata: object, objects: object, count: int, per: int = 10) -> list:
    owner = keys.Ownership("1", 1, time.time())
    metadata.put(keys.owner_key(TOPIC), owner.to_json())  # type: ignore[attr-defined]
    for i in range(count):
        start, end = i * per, i * per + per - 1
        object_id = object_id_for(start, end, 1)
        data = f"object {i}".encode()
        objects.put(object_key(TOPIC, start, object_id), data)  # type: ignore[attr-defined]
        descriptor = keys.ObjectDescriptor(start, end, object_id, len(data), "etag", time.time(), "1", 1,
                                           zlib.crc32(data), "00000000")
        metadata.put(keys.descriptor_key(TOPIC, start), descriptor.to_json())  # type: ignore[attr-defined]
    return [value_is(keys.owner_key(TOPIC), owner.to_json())]


def measure(metadata_url: str, objects_url: str, count: int) -> None:
    with open_metadata(metadata_url) as raw, open_objects(objects_url) as objects:
        fencing = build(raw, objects, count)
        metadata = CountingStore(raw)

        def retention(policy: ArchiveRetentionConfig) -> ArchiveRetention:
            return ArchiveRetention(TOPIC, metadata, objects, fencing=fencing, policy=policy,  # type: ignore[arg-type]
                                    broker_id="1", epoch=1, metrics=UploaderMetrics(CollectorRegistry()))

        for label, policy in (("cut to the tip", ArchiveRetentionConfig(bytes_max=0)),
                              ("nothing to cut", ArchiveRetentionConfig(bytes_max=0)),
                              ("retention off", ArchiveRetentionConfig())):
            metadata.txns = 0
            began = time.perf_counter()
            run = retention(policy).run(count * 10)
            took = time.perf_counter() - began
            print(f"{metadata_url.split(':')[0]:6} {count:6} descriptors  {label:15} {took * 1000:9.1f} ms  "
                  f"{metadata.txns:4} txns  deleted {run.descriptors_deleted} descriptors / "
                  f"{run.objects_deleted} objects"
                  + (f"  ({took / max(1, run.descriptors_deleted) * 1e6:.0f} us per descriptor)"
                     if run.descriptors_deleted else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, nargs="*", default=[100, 1000])
    parser.add_argument("--servers", action="store_true",
                        help="also on a private etcd server and moto S3 over HTTP (the test fixtures' servers)")
    args = parser.parse_args()
    etcd = moto = None
    if args.servers:
        import boto3

        from tests.fixtures.servers import EtcdServer, MotoServer, set_fake_aws_credentials

        set_fake_aws_credentials()
        etcd, moto = EtcdServer().start(), MotoServer().start()
        boto3.client("s3", endpoint_url=moto.endpoint_url, region_name="us-east-1").create_bucket(Bucket="bench")
    try:
        for count in args.count:
            with tempfile.TemporaryDirectory() as root:
                os.makedirs(f"{root}/objects")
                measure(f"sqlite:///{root}/meta.db", f"file://{root}/objects", count)
            if etcd is not None and moto is not None:
                measure(f"{etcd.url}/bench-{count}-{time.time_ns()}",
                        f"s3://bench/{count}?endpoint={moto.endpoint_url}&region=us-east-1", count)
    finally:
        for server in (etcd, moto):
            if server is not None:
                server.stop()


if __name__ == "__main__":
    main()
