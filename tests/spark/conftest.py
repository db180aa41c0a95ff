"""ONE Spark session (local[2]) for the whole Spark suite: starting one costs ~5 s."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")


# os.environ just before and just after the session's JVM started (for
# tests/spark/test_environment.py: starting a session must not change the environment).
ENVIRON_AROUND_LAUNCH: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from tests.fixtures.servers import set_fake_aws_credentials
    from tiered.spark.session import local_session

    # Python workers inherit the environment the JVM had at launch, so the fake AWS
    # credentials moto accepts must exist before the session starts.
    set_fake_aws_credentials()
    # Spark's default (pushdown off): tests that want it on switch it per query.
    ENVIRON_AROUND_LAUNCH["before"] = dict(os.environ)
    session = local_session(master="local[2]", app_name="dnb-tests", filter_pushdown=False)
    ENVIRON_AROUND_LAUNCH["after"] = dict(os.environ)
    try:
        yield session
    finally:
        session.stop()
