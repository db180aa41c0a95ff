"""Starting a session and querying the dnb1 source leave the process environment alone.

A library must not change ``os.environ`` behind its caller's back: the settings a local
driver needs travel as Spark settings (tiered/spark/session.py). The only variables that may
appear are the two PySpark's own ``SparkContext`` writes on every start, whoever starts it.
"""
from __future__ import annotations

import os
import sys

import pytest

from tests.spark.archive_util import messages, write_archive
from tests.spark.conftest import ENVIRON_AROUND_LAUNCH
from tiered.metadata import open_metadata
from tiered.objects import open_objects
from tiered.spark.session import _repo_root, local_session

pytestmark = pytest.mark.spark

# pyspark/core/context.py sets these two itself in SparkContext._do_init.
PYSPARK_OWN = {"SPARK_AUTH_SOCKET_TIMEOUT", "SPARK_BUFFER_SIZE"}
TOPIC = "/default/environment"


def _without_pyspark_own(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PYSPARK_OWN}


def test_starting_the_session_leaves_the_environment_alone(spark):
    before, after = ENVIRON_AROUND_LAUNCH["before"], ENVIRON_AROUND_LAUNCH["after"]
    assert _without_pyspark_own(after) == _without_pyspark_own(before)
    assert set(after) - set(before) <= PYSPARK_OWN


def test_joining_and_querying_leave_the_environment_alone(spark, tmp_path):
    before = dict(os.environ)
    joined = local_session(master="local[2]", app_name="dnb-tests", filter_pushdown=False)
    assert joined is spark
    with open_objects(f"file://{tmp_path}/objects") as objects, open_metadata(f"sqlite:///{tmp_path}/m.db") as meta:
        write_archive(objects, meta, TOPIC, messages(50), [(0, 49, "b", 1)])
    count = (spark.read.format("dnb1").option("topic", TOPIC).option("metadata", f"sqlite:///{tmp_path}/m.db")
             .option("objects", f"file://{tmp_path}/objects").load().count())
    assert count == 50
    assert dict(os.environ) == before


def test_workers_run_this_interpreter_with_the_packages_on_their_path(spark):
    # What the environment variables used to carry now travels as settings.
    assert spark.conf.get("spark.driver.host") == "127.0.0.1"
    assert spark.conf.get("spark.executorEnv.PYTHONPATH") == _repo_root()
    if "SPARK_CONF_DIR" not in os.environ:  # the quiet log4j2 configuration reached the JVM
        jvm_property = spark.sparkContext._jvm.java.lang.System.getProperty("log4j2.configurationFile")
        assert jvm_property.endswith("log4j2.properties")

    def probe(_: int) -> tuple[str, list[str]]:
        import os as worker_os
        import sys as worker_sys
        return worker_sys.executable, worker_os.environ.get("PYTHONPATH", "").split(worker_os.pathsep)

    [(executable, path)] = spark.sparkContext.parallelize([0], 1).map(probe).collect()
    assert os.path.realpath(executable) == os.path.realpath(sys.executable)
    assert _repo_root() in path
