"""A command learns at once that its object store cannot serve: the bucket is checked
when the store is opened (exit 4 for an unreachable endpoint, 2 for a missing bucket),
before anything is appended or uploaded."""
from __future__ import annotations

import uuid

import pytest

from tests.cli.helpers import dnb
from tests.fixtures.servers import free_port, set_fake_aws_credentials

TOPIC = "/default/checked"


def _sqlite(tmp_path) -> list[str]:
    return ["--data-dir", str(tmp_path / "d"), "--metadata", f"sqlite:///{tmp_path}/m.db"]


def test_an_unreachable_endpoint_fails_the_command_as_unavailable(tmp_path) -> None:
    set_fake_aws_credentials()
    endpoint = f"http://127.0.0.1:{free_port()}"
    objects = f"s3://bucket/p?endpoint={endpoint}&region=us-east-1"
    run = dnb(*_sqlite(tmp_path), "--objects", objects, "--json", "produce", TOPIC, "--count", "1")
    assert run.rc == 4, run
    error = run.json()["error"]
    assert (error["code"], error["type"], error["exit_code"]) == ("unavailable", "StorageUnavailable", 4)
    assert endpoint in error["message"]
    # Nothing was written: the check runs before the command touches the topic, so the
    # topic was not even created. A metadata-only command still answers with the store down.
    inspect = dnb(*_sqlite(tmp_path), "--objects", objects, "--json", "inspect", TOPIC)
    assert inspect.rc == 7, inspect
    assert inspect.json()["error"]["code"] == "not_found"
    assert not list((tmp_path / "d").rglob("*.seg"))  # and no WAL was opened


def test_the_check_can_be_turned_off(tmp_path) -> None:
    set_fake_aws_credentials()
    objects = f"s3://bucket/p?endpoint=http://127.0.0.1:{free_port()}&region=us-east-1"
    run = dnb(*_sqlite(tmp_path), "--objects", objects, "--set", "object_store.check_bucket=false",
              "produce", TOPIC, "--count", "1")
    assert run.rc == 0, run  # a durable produce needs no object store


@pytest.mark.s3
def test_a_missing_bucket_fails_the_command_naming_bucket_and_endpoint(tmp_path, moto_server) -> None:
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    objects = f"s3://{missing}/p?endpoint={moto_server.endpoint_url}"
    run = dnb(*_sqlite(tmp_path), "--objects", objects, "--json", "upload", TOPIC)
    assert run.rc == 2, run
    error = run.json()["error"]
    assert error["type"] == "BucketNotFound"
    assert missing in error["message"] and moto_server.endpoint_url in error["message"]
