"""``dnb query TOPIC "SQL"``: the library side (the CLI only parses and prints).

The topic's archive is exposed as the temporary view ``messages``; the SQL runs on a
local Spark session (started here unless the caller passes one) with filter pushdown on,
so ``WHERE offset BETWEEN ...`` reads only the objects and blocks it needs.
"""
from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from wal.topics import TopicName

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

VIEW_NAME = "messages"


def archive_frame(spark: "SparkSession", topic: str, metadata_url: str, objects_url: str,
                  **options: str):  # -> pyspark.sql.DataFrame
    """The topic's archive (committed descriptors only) as a DataFrame."""
    from tiered.spark.datasource import Dnb1DataSource

    spark.dataSource.register(Dnb1DataSource)
    reader = (spark.read.format("dnb1").option("topic", str(TopicName.parse(topic)))
              .option("metadata", metadata_url).option("objects", objects_url))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_query(topic: str, sql: str, metadata_url: str, objects_url: str,
              spark: "SparkSession | None" = None, **options: str) -> list[dict[str, Any]]:
    """Run ``sql`` against the view ``messages`` and return the rows as plain dicts.

    Binary values come back as ``bytes``, timestamps as naive UTC ``datetime``s, maps as
    ``dict``s. A session started here is stopped before returning; a passed one is not.
    ``options`` are extra ``dnb1`` source options (e.g. ``onCorrupt="skip"``).
    """
    topic = str(TopicName.parse(topic))  # fail before paying for a JVM
    owned = spark is None
    if spark is None:
        from tiered.spark.session import local_session

        spark = local_session(app_name="dnb-query")
    try:
        archive_frame(spark, topic, metadata_url, objects_url, **options).createOrReplaceTempView(VIEW_NAME)
        return [_plain(row.asDict(recursive=True)) for row in spark.sql(sql).collect()]
    finally:
        if owned:
            spark.stop()


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value
