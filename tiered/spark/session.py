"""A quiet, local Spark session for ``dnb query``, the tests and the benchmark.

Everything here must happen *before* the JVM starts: Spark reads ``SPARK_CONF_DIR``
(for ``log4j2.properties``), ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON`` only at launch.
Calling :func:`local_session` when a session already runs returns that session with
the runtime settings applied (``getOrCreate`` semantics).
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


def prepare_environment() -> None:
    """Set the process environment a local Spark driver and its Python workers need.

    * ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` = this interpreter, else workers run
      the system Python without our packages.
    * ``PYTHONPATH`` gets the repository root, so workers can import ``tiered`` even when
      the package is not installed into the interpreter (it is harmless when it is).
    * ``SPARK_LOCAL_IP`` pins the driver to loopback (no DNS look-up, no warning).
    * ``SPARK_CONF_DIR`` points at the quiet log4j2 configuration unless the caller
      already chose a conf dir on purpose.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("SPARK_CONF_DIR", _conf_dir())
    root = _repo_root()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


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
    prepare_environment()
    from pyspark.sql import SparkSession

    settings = dict(DEFAULT_CONF)
    settings["spark.sql.python.filterPushdown.enabled"] = "true" if filter_pushdown else "false"
    settings.update(conf or {})
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # getOrCreate on a running session ignores static settings but runtime SQL settings
    # must still hold for this caller.
    for key, value in settings.items():
        if key.startswith("spark.sql."):
            spark.conf.set(key, value)
    from tiered.spark.datasource import Dnb1DataSource

    spark.dataSource.register(Dnb1DataSource)
    return spark
