"""Opening an S3 store answers at once whether it can serve: a missing bucket is a typed
configuration error naming bucket and endpoint, an unreachable endpoint a typed
unavailable error; the retry/timeout policy differs for a broker and a one-shot command."""
from __future__ import annotations

import uuid

import pytest

from tests.fixtures.servers import free_port, set_fake_aws_credentials
from tiered.config import DnbConfig
from tiered.errors import BucketNotFound, StorageUnavailable
from tiered.objects import open_objects
from tiered.objects.config import ObjectStoreConfig
from tiered.objects.local import LocalObjectStore


def _retries(store: object) -> tuple[int, float]:
    config = store._client.meta.config  # type: ignore[attr-defined]
    return config.retries["total_max_attempts"], config.connect_timeout


@pytest.mark.s3
def test_an_existing_bucket_passes_the_check(moto_server, s3_bucket) -> None:
    with open_objects(f"s3://{s3_bucket}/p?endpoint={moto_server.endpoint_url}") as store:
        store.check()


@pytest.mark.s3
def test_a_missing_bucket_is_a_typed_error_naming_bucket_and_endpoint(moto_server) -> None:
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    with open_objects(f"s3://{missing}/p?endpoint={moto_server.endpoint_url}") as store:
        with pytest.raises(BucketNotFound) as checked:
            store.check()
        # Not "not found" of an object, not "unavailable": retrying does not help.
        assert not checked.value.retryable
        # Any later call names the same cause, not a bare NoSuchBucket.
        with pytest.raises(BucketNotFound) as put:
            store.put("k", b"v")
    for error in (checked.value, put.value):
        assert missing in str(error) and moto_server.endpoint_url in str(error)
        assert error.__cause__ is not None


def test_an_unreachable_endpoint_is_unavailable_at_the_check() -> None:
    set_fake_aws_credentials()
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused
    with open_objects(f"s3://bucket/p?endpoint={endpoint}&max_attempts=1") as store:
        with pytest.raises(StorageUnavailable) as info:
            store.check()
    assert endpoint in str(info.value) and info.value.retryable
    assert info.value.__cause__ is not None


def test_a_store_that_cannot_be_missing_passes_the_check(tmp_path) -> None:
    LocalObjectStore(str(tmp_path)).check()


def test_the_policy_defaults_depend_on_the_role_and_the_config_and_url_override_them() -> None:
    set_fake_aws_credentials()
    url = "s3://bucket/p?endpoint=http://127.0.0.1:1"
    policy = ObjectStoreConfig()
    with open_objects(url, **policy.s3_options("broker")) as broker, \
            open_objects(url, **policy.s3_options("command")) as command:
        assert _retries(broker) == (5, 3.0)
        assert _retries(command) == (2, 1.0)
    tuned = ObjectStoreConfig(max_attempts=3, connect_timeout_s=0.5)
    with open_objects(url, **tuned.s3_options("command")) as store:
        assert _retries(store) == (3, 0.5)
    # The URL is the more specific choice.
    with open_objects(url + "&max_attempts=7", **tuned.s3_options("command")) as store:
        assert _retries(store) == (7, 0.5)
    assert DnbConfig().object_store == ObjectStoreConfig()
    with pytest.raises(ValueError):
        ObjectStoreConfig(max_attempts=0)
