"""Bad input, servers down, torn writes and the fault wrappers."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.fixtures.servers import EtcdServer, free_port, set_fake_aws_credentials
from tiered.errors import (
    MalformedRecord,
    MissingDependency,
    ObjectNotFound,
    OperationTimeout,
    StorageUnavailable,
    UnknownScheme,
)
from tiered.archive.naming import object_key
from tiered.metadata import Put, absent, open_metadata
from tiered.metadata.testing.faults import FaultyMetadataStore
from tiered.metadata.keys import (
    ObjectDescriptor,
    SealedState,
    assignment_key,
    cursor_key,
    descriptor_key,
    state_key,
    unassigned_key,
)
from tiered.metadata.sqlite import SqliteMetadataStore
from tiered.objects import open_objects
from tiered.objects.testing.faults import FaultyObjectStore
from tiered.objects.local import LocalObjectStore

DOWN_BOUND_S = 3.0

# -- records ------------------------------------------------------------------
GOOD = ObjectDescriptor(0, 9, "abc", 10, "etag", 1.0, "b1", 1, 0, "00000000")


@pytest.mark.parametrize(
    "raw, problem",
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"start_offset": 0}', "missing field"),
        (GOOD.to_json().replace(b'"size":10', b'"size":"10"'), "size"),
        (GOOD.to_json().replace(b'"end_offset":9', b'"end_offset":-1'), "end_offset"),
        (GOOD.to_json().replace(b'"epoch":1', b'"epoch":true'), "epoch"),
        # A descriptor without its content digest cannot be checked: malformed, never trusted.
        (GOOD.to_json().replace(b'"footer_crc32c":0,', b""), "missing field 'footer_crc32c'"),
        (GOOD.to_json().replace(b'"block_crc32c":"00000000",', b""), "missing field 'block_crc32c'"),
        (GOOD.to_json().replace(b'"block_crc32c":"00000000"', b'"block_crc32c":"0000000"'), "block_crc32c"),
        (GOOD.to_json().replace(b'"footer_crc32c":0', b'"footer_crc32c":4294967296'), "footer_crc32c"),
        # The uploader's ids name the object's range: an id naming another range would send
        # readers, gc and retention to another range's object (atk28 F4: a bare ValueError).
        (GOOD.to_json().replace(b'"object_id":"abc"', b'"object_id":"data-1-9-e1"'), "does not name offsets 0-9"),
        (GOOD.to_json().replace(b'"object_id":"abc"', b'"object_id":"data-0-8-e1"'), "does not name offsets 0-9"),
        (GOOD.to_json().replace(b'"object_id":"abc"', b'"object_id":"data-00-9-e1"'), "does not name offsets 0-9"),
        (GOOD.to_json().replace(b'"object_id":"abc"', b'"object_id":"data-0"'), "does not name offsets 0-9"),
    ],
)
def test_malformed_descriptor_names_key_and_problem(raw: bytes, problem: str) -> None:
    key = descriptor_key("/ns/t", 0)
    with pytest.raises(MalformedRecord) as info:
        ObjectDescriptor.from_json(key, raw)
    assert info.value.key == key and problem in str(info.value)
    assert isinstance(info.value, ValueError)


def test_descriptor_ids_naming_their_own_range_are_accepted() -> None:
    key = descriptor_key("/ns/t", 0)
    for object_id in ("data-0-9-e1", "data-0-9-e1-0abc", "data-0-9", "abc"):
        raw = GOOD.to_json().replace(b'"object_id":"abc"', f'"object_id":"{object_id}"'.encode())
        assert ObjectDescriptor.from_json(key, raw).object_id == object_id


def test_sealed_state_null_means_start_at_zero() -> None:
    key = state_key("/ns/t")
    empty = SealedState(True, None, "b1", 1.0)
    assert SealedState.from_json(key, empty.to_json()).next_offset == 0
    assert SealedState(True, 41, "b1", 1.0).next_offset == 42
    with pytest.raises(MalformedRecord, match="last_committed_offset"):
        SealedState.from_json(key, b'{"sealed": true, "last_committed_offset": -1, "broker_id": "b", "timestamp": 1}')
    with pytest.raises(MalformedRecord, match="sealed"):
        SealedState.from_json(key, b'{"sealed": "yes", "last_committed_offset": 1, "broker_id": "b", "timestamp": 1}')


def test_descriptor_roundtrip_and_key_check() -> None:
    key = descriptor_key("/ns/t", 0)
    assert ObjectDescriptor.from_json(key, GOOD.to_json()).check_key(key) == GOOD
    with pytest.raises(MalformedRecord):
        GOOD.check_key(descriptor_key("/ns/t", 5))


@pytest.mark.parametrize("topic", ["../x", "/ns/../x", "/abs/olute/path", "//t", "/ns/", "ns", "/n\x00s/t", "/ns/" + "t" * 300, "/ns/t/", "", "/.quarantine/t", "/ns/.hidden", "/ns/."])
def test_hostile_topic_names_never_become_keys(topic: str) -> None:
    builders = [
        lambda t: descriptor_key(t, 0), state_key, lambda t: cursor_key(t, "s"),
        lambda t: assignment_key("b1", t), unassigned_key, lambda t: object_key(t, 0, "id"),
    ]  # fmt: skip
    for build in builders:
        with pytest.raises(ValueError):
            build(topic)


@pytest.mark.parametrize("bad", ["..", "a/b", "", "x\x00"])
def test_hostile_subscription_broker_and_object_ids(bad: str) -> None:
    with pytest.raises(ValueError):
        cursor_key("/ns/t", bad)
    with pytest.raises(ValueError):
        assignment_key(bad, "/ns/t")
    with pytest.raises(ValueError):
        object_key("/ns/t", 0, bad)


# -- URLs ---------------------------------------------------------------------
def test_unknown_schemes_are_clear_errors() -> None:
    with pytest.raises(UnknownScheme, match="sqlite"):
        open_metadata("redis://x")
    with pytest.raises(UnknownScheme, match="s3://"):
        open_objects("gs://bucket")
    assert issubclass(MissingDependency, ImportError)


# -- servers down -------------------------------------------------------------
def test_etcd_down_at_start_is_quick_typed_error() -> None:
    store = open_metadata(f"etcd://127.0.0.1:{free_port()}?timeout_s=1")
    started = time.monotonic()
    with pytest.raises(StorageUnavailable):
        store.put("/k", b"v")
    assert time.monotonic() - started < DOWN_BOUND_S
    store.close()


@pytest.mark.etcd
def test_etcd_down_mid_operation_then_back() -> None:
    server = EtcdServer().start()
    try:
        store = open_metadata(f"{server.url}/mid?timeout_s=1&endpoint_retry_s=0.2")
        store.put("/k", b"v")
        watch = store.watch_prefix("/")
        server.stop()
        started = time.monotonic()
        with pytest.raises(StorageUnavailable):
            store.txn([absent("/k2")], [Put("/k2", b"v")])
        with pytest.raises(StorageUnavailable):
            watch.get(timeout_s=DOWN_BOUND_S)  # the watch ends with a typed error too
        assert time.monotonic() - started < 2 * DOWN_BOUND_S
        store.close()
    finally:
        server.cleanup()


def test_s3_down_is_bounded_typed_error() -> None:
    set_fake_aws_credentials()
    url = f"s3://bucket/p?endpoint=http://127.0.0.1:{free_port()}&max_attempts=2&connect_timeout_s=0.5&read_timeout_s=1"
    store = open_objects(url)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as info:
        store.put("k", b"v")
    assert time.monotonic() - started < DOWN_BOUND_S
    assert "testing" not in str(info.value)  # no credentials in messages
    assert info.value.__cause__ is not None


def test_sqlite_lock_held_elsewhere_times_out_typed(tmp_path) -> None:
    path = tmp_path / "m.db"
    SqliteMetadataStore(path).close()
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    store = SqliteMetadataStore(path, busy_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(OperationTimeout):
        store.put("/k", b"v")
    assert time.monotonic() - started < DOWN_BOUND_S
    blocker.execute("ROLLBACK")
    store.put("/k", b"v")  # usable again once the lock is gone
    store.close()


# -- nothing half-written -------------------------------------------------------
def test_local_put_failing_before_publish_leaves_nothing(tmp_path) -> None:
    store = LocalObjectStore(tmp_path)

    def crash(_tmp: str) -> None:
        raise OSError(5, "injected I/O error")

    store.before_publish = crash
    with pytest.raises(StorageUnavailable):
        store.put("a/obj", b"x" * 1000)
    assert not store.exists("a/obj")
    assert os.listdir(store.tmp_dir) == []


_KILLED_WRITER = """
import os, sys, time
sys.path.insert(0, {root!r})
from tiered.objects.local import LocalObjectStore
store = LocalObjectStore({dir!r})
store.before_publish = lambda tmp: (print("ready", flush=True), time.sleep(60))
store.put("a/obj", b"y" * (1 << 20))
"""


def test_local_put_killed_mid_write_leaves_no_object(tmp_path) -> None:
    code = _KILLED_WRITER.format(root=os.getcwd(), dir=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = LocalObjectStore(tmp_path)
    assert not store.exists("a/obj")
    assert list(store.list()) == []
    assert store.sweep_temp() == 1  # the orphaned temp file


# -- fault wrappers -----------------------------------------------------------
def test_metadata_faults_nth_after_and_latency(tmp_path) -> None:
    store = FaultyMetadataStore(SqliteMetadataStore(tmp_path / "m.db"))
    store.faults.fail("put", nth=2)
    store.put("/a", b"1")
    with pytest.raises(StorageUnavailable):
        store.put("/b", b"2")
    store.put("/c", b"3")
    assert store.get("/b") is None
    store.faults.timeout("txn", when="after", delay_s=0.01)
    with pytest.raises(OperationTimeout):
        store.txn([absent("/d")], [Put("/d", b"4")])
    assert store.get("/d").value == b"4"  # applied, but the caller could not know
    store.faults.clear()
    store.faults.add_latency(0.05, op="get")
    started = time.monotonic()
    store.get("/a")
    assert time.monotonic() - started >= 0.05
    assert store.faults.calls["put"] == 3
    store.close()


def test_object_faults_fail_every_call_and_tear(tmp_path) -> None:
    store = FaultyObjectStore(LocalObjectStore(tmp_path))
    store.faults.tear("put")
    with pytest.raises(StorageUnavailable):
        store.put("t/x", b"0123456789")
    assert store.get("t/x") == b"01234"  # torn: a reader must validate
    store.faults.fail("get")  # every get from now on
    for _ in range(3):
        with pytest.raises(StorageUnavailable):
            store.get("t/x")
    store.faults.clear()
    with pytest.raises(ObjectNotFound):
        store.get("t/missing")


def test_a_record_its_reader_would_refuse_is_never_written() -> None:
    """Writers hold records to the readers' checks: an epoch or offset past 2**63 - 1, or a
    time that is NaN, raises before a byte is written, instead of leaving a record every
    later reader refuses as malformed (atk33 F02, F09)."""
    import math

    from tiered.metadata.keys import Ownership, lost_key

    with pytest.raises(ValueError, match="epoch"):
        Ownership("b1", 2**63, 1.0).to_json()
    with pytest.raises(ValueError, match="created_at"):
        ObjectDescriptor(0, 9, "abc", 10, "etag", math.nan, "b1", 1, 0, "00000000").to_json()
    with pytest.raises(ValueError, match="offset"):
        lost_key("/ns/t", 2**63 + 1, 1)  # one past a full topic (2**63) is a next offset; more is not
    with pytest.raises(MalformedRecord):
        ObjectDescriptor.from_json(descriptor_key("/ns/t", 0), GOOD.to_json().replace(b'"created_at":1.0',
                                                                                      b'"created_at":NaN'))


def test_a_fifo_where_an_object_belongs_is_refused_not_waited_on(tmp_path) -> None:
    """Opening a FIFO blocks until a writer comes: a reader of the local object store must
    get a typed error at once instead (atk33 F07)."""
    from tiered.errors import ObjectNotFound

    store = LocalObjectStore(str(tmp_path / "objects"))
    store.put("ns/t/data-0-0-e1.dnb1", b"x")
    path = tmp_path / "objects" / "ns" / "t" / "data-0-0-e1.dnb1"
    os.unlink(path)
    os.mkfifo(path)
    for read in (lambda: store.get("ns/t/data-0-0-e1.dnb1"), lambda: store.get_tail("ns/t/data-0-0-e1.dnb1", 4)):
        with pytest.raises(ObjectNotFound, match="not a regular file"):
            read()
