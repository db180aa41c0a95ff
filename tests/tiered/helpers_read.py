"""Shared helpers for the read-side tests (reader, cloud reader, subscriptions).

Fixtures here are imported by the test modules that use them (not via a conftest, so
other tests in this folder are unaffected). ``backends`` runs a test twice: against the
embedded pair (SQLite + local directory) and against real servers (etcd + moto over HTTP).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tiered.metadata import open_metadata
from tiered.metadata.base import MetadataStore
from tiered.objects import open_objects
from tiered.objects.base import ObjectStore

TOPIC = "/default/reliable_topic"
WAIT_S = 5.0


@dataclass
class Backends:
    kind: str
    metadata: MetadataStore
    objects: ObjectStore


@pytest.fixture(params=["local", pytest.param("remote", marks=[pytest.mark.etcd, pytest.mark.s3])])
def backends(request, tmp_path) -> Iterator[Backends]:
    """SQLite + local directory, then real etcd + moto (S3 over HTTP)."""
    if request.param == "local":
        metadata = open_metadata(f"sqlite://{tmp_path}/metadata.db")
        objects = open_objects(f"file://{tmp_path}/objects")
    else:
        etcd = request.getfixturevalue("etcd_server")
        root = request.getfixturevalue("etcd_root")
        moto = request.getfixturevalue("moto_server")
        bucket = request.getfixturevalue("s3_bucket")
        metadata = open_metadata(f"{etcd.url}{root}")
        objects = open_objects(f"s3://{bucket}/archive?endpoint={moto.endpoint_url}")
    try:
        yield Backends(request.param, metadata, objects)
    finally:
        objects.close()
        metadata.close()


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S, what: str = "condition") -> None:
    """Poll ``predicate`` with a bound; fail the test naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
