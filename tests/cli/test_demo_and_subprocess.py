"""The demo (the README's main job) and every command as a real subprocess."""
from __future__ import annotations

import os

import pytest

from tests.cli.helpers import broker, dnb, dnb_process
from tiered.tools.demo import run_demo

TOPIC = "/default/reliable_topic"
ROW_KEYS = {"time", "event", "broker_a", "broker_b", "cloud", "consumer", "reads"}


def _check_seed_timeline(result):
    assert result["ok"] and result["checks_failed"] == [] and result["verify"] == {"ok": True, "problems": []}
    rows = {row["time"]: row for row in result["timeline"]}
    assert list(rows) == [f"T{i}" for i in range(1, 11)]
    assert all(set(row) == ROW_KEYS for row in rows.values())
    assert rows["T1"]["broker_a"] == "Offsets 0-21"
    assert rows["T2"]["cloud"] == "0-21 stored"
    assert rows["T3"]["reads"] == [{"first_offset": 0, "last_offset": 13, "tier": "wal", "count": 14}]
    assert rows["T4"]["broker_a"] == "Seal state (21)"
    assert rows["T5"]["broker_b"] == "Load, WAL=22"
    assert rows["T6"]["broker_b"] == "Offsets 22-27"
    assert rows["T7"]["cloud"] == "22-27 stored"
    assert rows["T8"]["reads"] == [{"first_offset": 14, "last_offset": 21, "tier": "cloud", "count": 8}]
    assert rows["T9"]["reads"] == [{"first_offset": 22, "last_offset": 27, "tier": "wal", "count": 6}]
    assert rows["T10"]["consumer"] == "Cursor=27"


def test_demo_library_function():
    _check_seed_timeline(run_demo())


def test_demo_json_in_process():
    run = dnb("--json", "demo")
    assert run.rc == 0
    result = run.json()
    assert set(result) == {"topic", "metadata", "objects", "timeline", "checks_failed", "verify", "ok"}
    _check_seed_timeline(result)


def test_demo_table_as_a_subprocess():
    run = dnb_process("demo")
    assert run.rc == 0, run.err
    for text in ("Broker A", "Broker B", "Cloud", "Consumer", "Reads 14-21 (cloud)", "Reads 22-27 (WAL)",
                 "Load, WAL=22", "Seal state (21)", "Cursor=27", "verify: OK", "RESULT: ok"):
        assert text in run.out, text


def test_demo_keep_leaves_the_directory(tmp_path):
    result = dnb("--json", "demo", "--keep").json()
    assert result["ok"] and result["workdir"]
    import os
    import shutil

    assert os.path.exists(result["workdir"])
    shutil.rmtree(result["workdir"])


def test_every_command_as_a_subprocess_json_and_table(tmp_path):
    a, b = broker(tmp_path, "1"), broker(tmp_path, "2")
    assert dnb_process(*a, "--json", "produce", TOPIC, "--count", "4").json() == {"first_offset": 0, "last_offset": 3}
    run = dnb_process(*a, "produce", TOPIC, stdin="x\ny\n")
    assert run.rc == 0 and "last_offset   5" in run.out
    assert dnb_process(*a, "--json", "upload", TOPIC).json() == {"committed_through": 5}
    assert "committed_through" in dnb_process(*a, "upload", TOPIC).out
    got = dnb_process(*a, "--json", "consume", TOPIC, "--subscription", "s", "--max", "2", "--ack").json()
    assert [m["offset"] for m in got["messages"]] == [0, 1]
    assert "2 message(s)" in dnb_process(*a, "consume", TOPIC, "--subscription", "s", "--max", "2").out
    refused = dnb_process(*b, "seal", TOPIC)
    assert refused.rc == 3 and "does not own" in refused.err and "Traceback" not in refused.err
    assert dnb_process(*a, "--json", "seal", TOPIC).json() == {"last_committed_offset": 5}
    assert dnb_process(*b, "--json", "restore", TOPIC).json() == {"next_offset": 6}
    assert "next_offset" in dnb_process(*b, "restore", TOPIC).out
    assert dnb_process(*b, "seal", TOPIC).rc == 0
    assert dnb_process(*a, "restore", TOPIC).rc == 0
    info = dnb_process(*a, "--json", "inspect", TOPIC).json()
    assert info["owner"] == "1" and info["cursors"] == {"s": 1}
    assert "descriptors:" in dnb_process(*a, "inspect", TOPIC).out
    assert dnb_process(*a, "--json", "verify", TOPIC).json() == {"ok": True, "problems": []}
    assert "OK" in dnb_process(*a, "verify", TOPIC).out
    summary = dnb_process("--json", "harness", "--scenarios", "2").json()
    assert summary["passed"] == 2 and summary["failed"] == 0
    assert "1 of 1 scenario(s) passed from seed 5" in dnb_process("harness", "--scenarios", "1", "--first-seed", "5").out


def test_bad_url_and_hostile_name_as_a_subprocess(tmp_path):
    run = dnb_process("--data-dir", str(tmp_path / "d"), "--objects", "ftp://x", "seal", TOPIC)
    assert run.rc == 2 and "unknown scheme 'ftp'" in run.err and "Traceback" not in run.err
    run = dnb_process("--data-dir", str(tmp_path / "d"), "produce", "../../etc/passwd", "--count", "1")
    assert run.rc == 2 and "topic name" in run.err and "Traceback" not in run.err


def test_env_vars_in_a_subprocess(tmp_path):
    env = {"DNB_DATA_DIR": str(tmp_path / "e"), "DNB_BROKER_ID": "9", "DNB_JSON": "1"}
    assert dnb_process("produce", TOPIC, "--count", "1", env=env).json() == {"first_offset": 0, "last_offset": 0}
    assert dnb_process("inspect", TOPIC, env=env).json()["owner"] == "9"


# -- real servers -----------------------------------------------------------------------

@pytest.mark.etcd
@pytest.mark.s3
def test_demo_on_real_etcd_and_moto(etcd_server, etcd_root, moto_server, s3_bucket):
    objects = f"s3://{s3_bucket}/demo?endpoint={moto_server.endpoint_url}"
    result = run_demo(metadata_url=etcd_server.url + etcd_root, objects_url=objects)
    assert result["topic"].startswith("/default/reliable_topic-")
    _check_seed_timeline(result)


@pytest.mark.etcd
@pytest.mark.s3
def test_cli_move_on_real_etcd_and_moto(tmp_path, etcd_server, etcd_root, moto_server, s3_bucket):
    real = ["--metadata", etcd_server.url + etcd_root,
            "--objects", f"s3://{s3_bucket}/cli?endpoint={moto_server.endpoint_url}"]
    a = ["--data-dir", str(tmp_path / "a"), *real, "--broker-id", "1"]
    b = ["--data-dir", str(tmp_path / "b"), *real, "--broker-id", "2"]
    assert dnb(*a, "--json", "produce", TOPIC, "--count", "5").json() == {"first_offset": 0, "last_offset": 4}
    assert dnb(*b, "seal", TOPIC).rc == 3
    assert dnb(*a, "--json", "seal", TOPIC).json() == {"last_committed_offset": 4}
    assert dnb(*b, "--json", "restore", TOPIC).json() == {"next_offset": 5}
    got = dnb(*b, "--json", "consume", TOPIC, "--subscription", "s", "--ack").json()["messages"]
    assert [(m["offset"], m["tier"]) for m in got] == [(o, "cloud") for o in range(5)]
    assert dnb(*b, "--json", "verify", TOPIC).json() == {"ok": True, "problems": []}


@pytest.mark.spark
def test_query_runs_spark_sql_over_the_archive(tmp_path):
    pytest.importorskip("pyspark")
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "5")
    dnb(*a, "upload", TOPIC)
    run = dnb(*a, "--json", "query", TOPIC, "SELECT count(*) AS n, max(offset) AS top FROM messages")
    assert run.rc == 0, run.err
    assert run.json() == {"columns": ["n", "top"], "rows": [[5, 4]]}


@pytest.mark.spark
def test_query_over_a_corrupt_object_is_one_line_and_a_data_error(tmp_path):
    pytest.importorskip("pyspark")
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "50", "--ack", "archived")
    [path] = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "objects") for f in fs if f.endswith(".dnb1")]
    with open(path, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    run = dnb(*a, "--json", "query", TOPIC, "SELECT count(*) AS n FROM messages")
    assert run.rc == 5, (run.out, run.err)
    assert run.json()["error"]["exit_code"] == 5
    assert "Traceback" not in run.err and "query failed" in run.err


def test_query_table_mode_and_json_safe_values(tmp_path, monkeypatch):
    import datetime as dt

    import tiered.spark.query as spark_query

    rows = [{"offset": 0, "payload": b"hi", "key": b"\xff", "t": dt.datetime(2026, 1, 1)}]
    monkeypatch.setattr(spark_query, "run_query", lambda *args, **kw: rows)
    run = dnb(*broker(tmp_path, "1"), "query", TOPIC, "SELECT 1")
    assert run.rc == 0 and "offset" in run.out and "1 row(s)" in run.out
    got = dnb(*broker(tmp_path, "1"), "--json", "query", TOPIC, "SELECT 1").json()
    assert got == {"columns": ["offset", "payload", "key", "t"],
                   "rows": [[0, "hi", "base64:/w==", "2026-01-01T00:00:00"]]}
