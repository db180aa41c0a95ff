"""read_partition without a Spark session: batching, exact windows, splitting, corrupt groups."""
from __future__ import annotations

import pytest

from native.columns import ColumnsTooLarge
from native.errors import CorruptObject
from tests.spark.archive_util import messages, write_archive
from tiered.objects import open_objects
from tiered.spark import metrics, reading
from tiered.spark.options import parse_options
from tiered.spark.planning import plan

TOPIC = "/default/reading"
COUNT = 900


@pytest.fixture(scope="module")
def produced():
    return messages(COUNT)


@pytest.fixture
def archive(tmp_path, produced):
    url = f"file://{tmp_path}/objects"
    with open_objects(url) as objects:
        keys = write_archive(objects, None, TOPIC, produced, [(0, COUNT - 1, "b", 1)], block_bytes=1024)
    return {"url": f"{url}/default/reading", "path": tmp_path / "objects" / keys[0], "metrics": str(tmp_path / "m")}


def _read(archive, **options):
    opts = parse_options({"path": archive["url"], "metricsDir": archive["metrics"], **options})
    batches = [b for p in plan(opts, opts.bounds) for b in reading.read_partition(p)]
    for b in batches:
        b.validate(full=True)
    return batches


def _check(batches, produced, offsets):
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["offset"] for r in rows] == list(offsets)
    for r in rows:
        m = produced[r["offset"]]
        assert (r["payload"], r["key"], dict(r["attributes"]), r["topic"]) == (m.payload, m.key, m.attributes, TOPIC)
        assert int(r["publish_time"].timestamp() * 1000) == m.publish_time


def test_adjacent_blocks_are_decoded_into_few_large_batches(archive, produced, monkeypatch):
    monkeypatch.setattr(reading, "BATCH_ROWS_TARGET", 300)
    batches = _read(archive)
    _check(batches, produced, range(COUNT))
    assert 3 <= len(batches) <= 4 and all(b.num_rows >= 300 for b in batches[:-1])
    assert metrics.collect(archive["metrics"])["rows"] == COUNT


def test_windows_and_offset_in_are_exact(archive, produced):
    _check(_read(archive, startingOffset="101", endingOffset="777"), produced, range(101, 778))
    lo, hi = produced[250].publish_time, produced[260].publish_time
    _check(_read(archive, startingTimestamp=str(lo), endingTimestamp=str(hi)), produced, range(250, 261))
    opts = parse_options({"path": archive["url"]})
    bounds = opts.bounds.tighten(offsets_in=frozenset({3, 400, 899}))
    _check([b for p in plan(opts, bounds) for b in reading.read_partition(p)], produced, [3, 400, 899])


def test_a_group_too_large_for_int32_offsets_is_split(archive, produced, monkeypatch):
    real = reading.decode_columns
    calls = []

    def small(frames, lo, hi, tlo, thi):
        calls.append((lo, hi))
        if hi - lo + 1 > 200:
            raise ColumnsTooLarge("payload_data", 999, 998)
        return real(frames, lo, hi, tlo, thi)

    monkeypatch.setattr(reading, "decode_columns", small)
    _check(_read(archive), produced, range(COUNT))
    assert len(calls) > 5


def test_a_bad_record_in_a_group_fails_or_is_skipped_alone(archive, produced, monkeypatch):
    """block_frames already rejects bad records, so a group-level failure is simulated."""
    real = reading.decode_columns

    def failing(frames, lo, hi, tlo, thi):
        if lo <= 450 <= hi:
            from native.columns import ColumnsError
            raise ColumnsError(0, "simulated")
        return real(frames, lo, hi, tlo, thi)

    monkeypatch.setattr(reading, "decode_columns", failing)
    with pytest.raises(CorruptObject, match="simulated"):
        _read(archive)
    batches = _read(archive, onCorrupt="skip")
    got = [r["offset"] for b in batches for r in b.to_pylist()]
    skipped = metrics.collect(archive["metrics"])["skipped"]
    assert len(skipped) == 1 and skipped[0]["first_offset"] <= 450 <= skipped[0]["last_offset"]
    gone = set(range(skipped[0]["first_offset"], skipped[0]["last_offset"] + 1))
    assert got == [o for o in range(COUNT) if o not in gone] and len(gone) < 100
