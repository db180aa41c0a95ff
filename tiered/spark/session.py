"""A quiet, local Spark session for ``dnb query``, the tests and the benchmark.

A library must not change the process environment behind its caller's back, so nothing
here writes to ``os.environ``: what a Spark driver would usually take from environment
variables at launch is passed as Spark settings on the command line of the JVM it starts
(``spark.driver.bindAddress``/``spark.driver.host`` instead of ``SPARK_LOCAL_IP``, a
``-Dlog4j2.configurationFile`` Java option instead of ``SPARK_CONF_DIR``,
``spark.executorEnv.PYTHONPATH`` instead of ``PYTHONPATH``), and the interpreter the Python
workers run (``PYSPARK_PYTHON``) is set on the session's context, where PySpark keeps it.
Calling :func:`local_session` when a session already runs returns that session with the
runtime settings applied (``getOrCreate`` semantics).
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyspark is an optional dependency (extra "spark")
    from pyspark.sql import SparkSession

# Root logger and the shell's logger at the same level: Spark prints "Setting default log
# level" whenever the two differ in a Python-launched driver. The shell's logger is the
# class that initialised logging: the REPL's main class, or PythonGatewayServer for PySpark.
_LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.pygateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.pygateway.level = error
"""

# Settings that make a one-laptop session fast to start and quiet. Callers override
# any of them through ``conf``.
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # A local session has 1-2 cores; 200 shuffle partitions would be 200 tiny tasks.
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
}


def _repo_root() -> str:
    """The directory that holds the ``tiered`` package (workers must import it)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _conf_dir() -> str:
    """A private SPARK_CONF_DIR holding only the quiet log4j2 configuration."""
    path = os.path.join(tempfile.gettempdir(), f"dnb-spark-conf-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "log4j2.properties")
    try:
        with open(target) as f:
            if f.read() == _LOG4J2_PROPERTIES:
                return path
    except FileNotFoundError:
        pass
    # Write-then-rename so two processes starting at once never see half a file.
    tmp = f"{target}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(_LOG4J2_PROPERTIES)
    os.replace(tmp, target)
    return path


def launch_conf(master: str) -> dict[str, str]:
    """The Spark settings that replace the environment variables a local driver needs.

    * ``spark.executorEnv.PYTHONPATH`` puts the repository root on the workers' path, so
      they can import ``tiered`` even when the package is not installed into the
      interpreter (harmless when it is; Spark appends the JVM's own ``PYTHONPATH``).
    * ``spark.driver.bindAddress`` / ``spark.driver.host`` pin a local driver to loopback
      (no DNS look-up, no warning), unless ``SPARK_LOCAL_IP`` already chooses an address.
    * ``spark.driver.extraJavaOptions`` points log4j2 at the quiet configuration, unless
      ``SPARK_CONF_DIR`` already chooses a configuration on purpose.

    Nothing here reads more of the environment than those two opt-outs; callers override
    any setting through ``local_session(conf=...)``.
    """
    settings = {"spark.executorEnv.PYTHONPATH": _repo_root()}
    if master.startswith("local") and "SPARK_LOCAL_IP" not in os.environ:
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.driver.host"] = "127.0.0.1"
    if "SPARK_CONF_DIR" not in os.environ:
        log4j2 = os.path.join(_conf_dir(), "log4j2.properties")
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j2}"
    return settings


def local_session(
    master: str = "local[2]",
    app_name: str = "dnb",
    conf: Mapping[str, str] | None = None,
    filter_pushdown: bool = True,
) -> "SparkSession":
    """Start (or join) a quiet local session with the ``dnb1`` source registered.

    ``filter_pushdown`` sets ``spark.sql.python.filterPushdown.enabled``: with it on, SQL
    filters on ``offset`` / ``publish_time`` prune objects and blocks; the source works
    either way.
    """
    from pyspark.sql import SparkSession

    settings = dict(DEFAULT_CONF)
    settings.update(launch_conf(master))
    settings["spark.sql.python.filterPushdown.enabled"] = "true" if filter_pushdown else "false"
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # PySpark reads PYSPARK_PYTHON once, into the context's ``pythonExec``, and hands that to
    # every Python function it ships (the data source included). Without the variable it is
    # "python3" from the PATH, which may lack our packages: use this interpreter instead.
    if "PYSPARK_PYTHON" not in os.environ:
        spark.sparkContext.pythonExec = sys.executable
    # getOrCreate on a running session ignores static settings but runtime SQL settings
    # must still hold for this caller.
    for key, value in settings.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    from tiered.spark.datasource import Dnb1DataSource

    spark.dataSource.register(Dnb1DataSource)
    return spark
