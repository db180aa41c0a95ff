"""The fault-injecting wrappers satisfy the store contracts of what they wrap.

Tests that arm faults on a ``FaultyMetadataStore`` / ``FaultyObjectStore`` trust that,
faults aside, the wrapper behaves exactly as the inner store: so every contract binding
runs once more here with its store wrapped and no fault armed. The bindings are reached
through their modules (not imported by class name) so pytest does not collect them twice.
"""
from __future__ import annotations

import pytest

from tests.stores import test_metadata_etcd, test_metadata_sqlite, test_objects_local, test_objects_s3
from tiered.metadata import open_metadata
from tiered.metadata.testing import FaultyMetadataStore
from tiered.objects import open_objects
from tiered.objects.testing import FaultyObjectStore


class _WrappedMetadata:
    @pytest.fixture
    def store(self, store_url: str):
        wrapped = FaultyMetadataStore(open_metadata(store_url))
        yield wrapped
        wrapped.close()


class _WrappedObjects:
    @pytest.fixture
    def objects(self, objects_url: str):
        wrapped = FaultyObjectStore(open_objects(objects_url))
        yield wrapped
        wrapped.close()


class TestFaultySqliteMetadata(_WrappedMetadata, test_metadata_sqlite.TestSqliteMetadata):
    pass


@pytest.mark.etcd
class TestFaultyEtcdMetadata(_WrappedMetadata, test_metadata_etcd.TestEtcdMetadata):
    pass


class TestFaultyLocalObjects(_WrappedObjects, test_objects_local.TestLocalObjects):
    pass


@pytest.mark.s3
class TestFaultyS3Objects(_WrappedObjects, test_objects_s3.TestS3Objects):
    pass
