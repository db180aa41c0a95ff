"""A Python data source with dnb1's schema that yields ready-made Arrow batches.

The floor of Spark's Python data source path: no storage, no decoding, just Spark taking
Arrow batches from a Python worker and turning them into rows. ``bench_spark.py`` times it
beside dnb1 and Parquet so the table shows how much of dnb1's gap to Parquet is Spark's
ingestion of Python sources rather than the archive format or the decoder.
"""
from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from tiered.spark.datasource import SCHEMA_DDL

BATCH_ROWS = 65_536


class FloorReader(DataSourceReader):
    def __init__(self, rows: int, partitions: int, payload_bytes: int) -> None:
        self.rows, self.partitions_n, self.payload_bytes = rows, partitions, payload_bytes

    def partitions(self) -> list[InputPartition]:
        per = -(-self.rows // self.partitions_n)
        return [InputPartition((start, min(per, self.rows - start))) for start in range(0, self.rows, per)]

    def read(self, partition: InputPartition):
        import pyarrow as pa

        start, count = partition.value
        n = BATCH_ROWS
        constant = [
            pa.repeat(pa.scalar("/bench/floor", pa.string()), n),
            pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
            pa.nulls(n, pa.binary()),
            pa.MapArray.from_arrays(pa.array([0] * (n + 1), pa.int32()), pa.array([], pa.string()),
                                    pa.array([], pa.string()), type=pa.map_(pa.string(), pa.string())),
            pa.array([b"x" * self.payload_bytes] * n, pa.binary()),
        ]
        for done in range(0, count, n):
            k = min(n, count - done)
            offsets = pa.array(range(start + done, start + done + k), pa.int64())
            topic, times, keys, attributes, payloads = (c.slice(0, k) for c in constant)
            yield pa.RecordBatch.from_arrays([topic, offsets, times, keys, attributes, payloads],
                                             names=["topic", "offset", "publish_time", "key", "attributes", "payload"])


class FloorSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "dnbfloor"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> FloorReader:
        return FloorReader(int(self.options["rows"]), int(self.options.get("partitions", "4")),
                           int(self.options.get("payloadBytes", "100")))
