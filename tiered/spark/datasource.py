"""The ``dnb1`` PySpark data source: archived topic history as a DataFrame.

Usage::

    from tiered.spark import Dnb1DataSource
    spark.dataSource.register(Dnb1DataSource)
    # by topic, through the committed descriptors (every broker the topic lived on):
    df = (spark.read.format("dnb1").option("topic", "/default/reliable_topic")
          .option("metadata", "etcd://127.0.0.1:2379").option("objects", "s3://bucket/prefix").load())
    # by location, without metadata (lists *.dnb1 objects and reads their footers):
    df = spark.read.format("dnb1").load("s3://bucket/prefix/topics/default/reliable_topic")

Schema: ``topic string, offset long, publish_time timestamp, key binary,
attributes map<string,string>, payload binary``.

Options (names are case-insensitive):

==================  ===============================================================
topic               ``/ns/topic``; required by topic; by location it only names the
                    ``topic`` column (default: the location's last two segments)
metadata, objects   metadata URL (``etcd://``, ``sqlite://``) and object-store URL
                    (``s3://bucket/prefix``, ``file:///dir``) for reading by topic
endpoint, region    S3 endpoint / region (else ``AWS_ENDPOINT_URL`` and the AWS chain)
startingOffset      first offset to return (inclusive)
endingOffset        last offset to return (inclusive)
startingTimestamp   earliest publish time (inclusive; epoch ms or ISO-8601, naive = UTC)
endingTimestamp     latest publish time (inclusive)
onCorrupt           ``fail`` (default): a corrupt object or block fails the query with
                    an error naming the object and byte position; ``skip``: leave it
                    out and report it (log + ``skipped-*.json`` in ``metricsDir``)
metricsDir          directory that receives one JSON file per plan and per task
                    (objects/blocks/bytes read); see :mod:`tiered.spark.metrics`
partitionBytesMax   bytes one task reads (default 128 MiB, like Spark's
                    ``spark.sql.files.maxPartitionBytes``)
openCostBytes       what one more object weighs when packing (default 4 MiB, like
                    ``spark.sql.files.openCostInBytes``)
pushdown            ``false`` (default) / ``auto`` / ``true``, see below
footerThreads       parallel footer reads while planning (default 8)
==================  ===============================================================

Partitioning by bytes: a large object is split into runs of adjacent blocks of at most
``partitionBytesMax``; consecutive small objects are packed into one task up to it (each
weighing its bytes plus ``openCostBytes``), so many small objects are few tasks. Every
object is still checked against its descriptor. See :mod:`tiered.spark.planning`.

Pruning: the offset and timestamp options skip whole objects (by descriptor, before any
request, or by footer) and whole blocks (by the footer's block index); returned rows are
exactly those inside the windows.

Filter pushdown is OFF by default, on purpose. Spark 4.3 keeps the state a Python
reader's ``pushFilters`` left behind per table, not per scan: a second query on the same
DataFrame reuses the first query's pruned partitions (``df.where("offset >= 90").count()``
then ``df.count()`` returns 10, not 100), and two scans of one view in a single query
(a UNION or two subqueries with different offset filters) both get the last scan's
filters. ``tests/spark/test_datasource.py`` pins that the default returns correct rows in
exactly those cases. Pruning that is always safe: the ``startingOffset`` /
``endingOffset`` / ``startingTimestamp`` / ``endingTimestamp`` options, which belong to
the DataFrame itself.

Opting in (``pushdown=auto``) is for a DataFrame that serves exactly one query with one
scan of it: when ``spark.sql.python.filterPushdown.enabled`` is true, filters on
``offset`` (=, <, <=, >, >=, IN) are consumed and applied exactly, and filters on
``publish_time`` prune blocks and are handed back to Spark. Spark refuses a reader that
*defines* ``pushFilters`` while the flag is off (``DATA_SOURCE_PUSHDOWN_DISABLED``), and
the reader cannot see the flag, so with ``auto`` ``reader()`` returns the
pushdown-capable reader only when Spark calls it from its filter-pushdown planner;
``pushdown=true`` forces it (the query then needs the flag on).
"""
from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from tiered.spark.options import Bounds, ReadOptions, parse_options

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA_DDL = (
    "topic string, offset long, publish_time timestamp, key binary, "
    "attributes map<string,string>, payload binary"
)
# Spark's planner module that calls pushFilters right after reader(); its name is how
# reader() tells the pushdown path from the plain one (checked on Spark 4.1-4.3).
_PUSHDOWN_PLANNER_MODULE = "pyspark.sql.worker.data_source_pushdown_filters"
_CALLER_FRAMES_MAX = 8


class Dnb1DataSource(DataSource):
    __doc__ = __doc__

    @classmethod
    def name(cls) -> str:
        return "dnb1"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_options(self.options)
        if options.pushdown == "true" or (options.pushdown == "auto" and _called_for_pushdown()):
            return Dnb1PushdownReader(options)
        return Dnb1Reader(options)


def _called_for_pushdown() -> bool:
    frame = sys._getframe(1)
    for _ in range(_CALLER_FRAMES_MAX):
        if frame is None:
            return False
        if frame.f_globals.get("__name__") == _PUSHDOWN_PLANNER_MODULE:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class Dnb1Reader(DataSourceReader):
    """Plans partitions from the options; ``read`` is stateless (see module docstring)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.bounds: Bounds = options.bounds

    def partitions(self) -> Sequence[InputPartition]:
        from tiered.spark.planning import plan

        parts = plan(self.options, self.bounds)
        # Spark wants at least one partition; an empty plan reads nothing.
        return parts or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator["pa.RecordBatch"]:
        from tiered.spark.planning import Dnb1Partition
        from tiered.spark.reading import read_partition

        if not isinstance(partition, Dnb1Partition):
            return iter(())
        return read_partition(partition)


class Dnb1PushdownReader(Dnb1Reader):
    """:class:`Dnb1Reader` plus ``pushFilters`` (only handed out when Spark pushes)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        from tiered.spark.planning import push_filters

        self.bounds, remaining = push_filters(self.bounds, filters)
        return remaining
