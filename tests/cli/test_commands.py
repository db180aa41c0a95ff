"""Every ``dnb`` command in-process, with and without --json, with its exact JSON keys;
the move done by hand on two data dirs; refusals that change nothing."""
from __future__ import annotations

import os

import pytest

from tests.cli.helpers import broker, dnb, stores

TOPIC = "/default/reliable_topic"
INSPECT_KEYS = {"topic", "owner", "epoch", "sealed_state", "descriptors", "cursors", "local_wal", "lost_ranges",
                "archive_start"}


def test_move_by_hand_json(tmp_path):
    a, b = broker(tmp_path, "1"), broker(tmp_path, "2")
    assert dnb(*a, "--json", "produce", TOPIC, "--count", "22").json() == {"first_offset": 0, "last_offset": 21}
    assert dnb(*a, "--json", "upload", TOPIC).json() == {"committed_through": 21}
    read = dnb(*a, "--json", "consume", TOPIC, "--subscription", "subs", "--max", "14", "--ack").json()
    assert set(read) == {"messages"}
    assert [m["offset"] for m in read["messages"]] == list(range(14))
    assert all(set(m) == {"offset", "tier", "payload", "encoding"} for m in read["messages"])
    assert {m["tier"] for m in read["messages"]} == {"wal"}
    assert read["messages"][0] == {"offset": 0, "tier": "wal", "payload": "message-0", "encoding": "utf-8"}

    assert dnb(*a, "--json", "seal", TOPIC).json() == {"last_committed_offset": 21}
    assert dnb(*b, "--json", "restore", TOPIC).json() == {"next_offset": 22}
    assert dnb(*b, "--json", "produce", TOPIC, "--count", "6").json() == {"first_offset": 22, "last_offset": 27}
    read = dnb(*b, "--json", "consume", TOPIC, "--subscription", "subs", "--ack").json()["messages"]
    assert [(m["offset"], m["tier"]) for m in read] == [(o, "cloud") for o in range(14, 22)] + \
        [(o, "wal") for o in range(22, 28)]

    info = dnb(*b, "--json", "inspect", TOPIC).json()
    assert set(info) == INSPECT_KEYS
    assert info["owner"] == "2" and info["cursors"] == {"subs": 27}
    assert info["local_wal"] == {"first_offset": 22, "last_offset": 27}
    assert [(d["start_offset"], d["end_offset"]) for d in info["descriptors"]] == [(0, 21)]
    assert dnb(*b, "--json", "verify", TOPIC).json() == {"ok": True, "problems": []}


def test_every_command_table_mode(tmp_path):
    a, b = broker(tmp_path, "1"), broker(tmp_path, "2")
    run = dnb(*a, "produce", TOPIC, "--count", "3", "--size", "5")
    assert run.rc == 0 and "first_offset" in run.out and "last_offset" in run.out and "{" not in run.out
    run = dnb(*a, "upload", TOPIC)
    assert run.rc == 0 and "committed_through" in run.out
    run = dnb(*a, "consume", TOPIC, "--subscription", "s", "--from", "earliest")
    assert run.rc == 0 and "offset" in run.out and "tier" in run.out and "3 message(s)" in run.out
    run = dnb(*a, "seal", TOPIC)
    assert run.rc == 0 and "last_committed_offset  2" in run.out
    run = dnb(*b, "restore", TOPIC)
    assert run.rc == 0 and "next_offset  3" in run.out
    run = dnb(*b, "inspect", TOPIC)
    assert run.rc == 0 and "descriptors:" in run.out and "cursors:" in run.out
    run = dnb(*b, "verify", TOPIC)
    assert run.rc == 0 and "OK" in run.out


def test_produce_from_stdin_and_binary_payload_is_base64(tmp_path):
    a = broker(tmp_path, "1")
    assert dnb(*a, "--json", "produce", TOPIC, stdin="hello\nworld\n").json() == \
        {"first_offset": 0, "last_offset": 1}
    from tiered.tools.cli.commands import message_json
    from tiered.read.messages import Message

    assert message_json(Message(5, 0, None, {}, b"\xff\x00", "cloud")) == \
        {"offset": 5, "tier": "cloud", "payload": "/wA=", "encoding": "base64"}
    got = dnb(*a, "--json", "consume", TOPIC, "--subscription", "s", "--from", "1").json()["messages"]
    assert [(m["offset"], m["payload"]) for m in got] == [(1, "world")]


def test_consume_follow_stops_after_idle_timeout(tmp_path):
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "2")
    run = dnb(*a, "--json", "consume", TOPIC, "--subscription", "s", "--follow", "--idle-timeout-s", "0.3")
    assert run.rc == 0 and [m["offset"] for m in run.json()["messages"]] == [0, 1]


def test_consume_on_a_sealed_topic_reads_the_archive_without_taking_it(tmp_path):
    a, b = broker(tmp_path, "1"), broker(tmp_path, "2")
    dnb(*a, "produce", TOPIC, "--count", "4")
    dnb(*a, "seal", TOPIC)
    got = dnb(*b, "--json", "consume", TOPIC, "--subscription", "s", "--ack").json()["messages"]
    assert [(m["offset"], m["tier"]) for m in got] == [(o, "cloud") for o in range(4)]
    info = dnb(*b, "--json", "inspect", TOPIC).json()
    assert info["owner"] is None and info["cursors"] == {"s": 3}


def test_same_broker_recovers_its_wal_between_invocations(tmp_path):
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "5")
    assert dnb(*a, "--json", "produce", TOPIC, "--count", "1").json() == {"first_offset": 5, "last_offset": 5}
    info = dnb(*a, "--json", "inspect", TOPIC).json()
    assert info["owner"] == "1" and info["local_wal"] == {"first_offset": 0, "last_offset": 5}
    assert info["descriptors"] == []


def test_env_vars_configure_global_options(tmp_path, monkeypatch):
    monkeypatch.setenv("DNB_DATA_DIR", str(tmp_path / "env-broker"))
    monkeypatch.setenv("DNB_BROKER_ID", "7")
    monkeypatch.setenv("DNB_JSON", "1")
    assert dnb("produce", TOPIC, "--count", "1").json() == {"first_offset": 0, "last_offset": 0}
    assert dnb("inspect", TOPIC).json()["owner"] == "7"
    assert os.path.exists(tmp_path / "env-broker" / "metadata.db")
    assert os.path.isdir(tmp_path / "env-broker" / "wal" / "default" / "reliable_topic")


# -- refusals ---------------------------------------------------------------------------

def _state(tmp_path):
    return dnb(*broker(tmp_path, "1"), "--json", "inspect", TOPIC).json()


def test_seal_on_a_non_owner_refuses_and_changes_nothing(tmp_path):
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "3")
    before = _state(tmp_path)
    run = dnb(*broker(tmp_path, "2"), "seal", TOPIC)
    assert run.rc == 3 and run.out == ""
    assert "does not own the topic" in run.err and "broker 1" in run.err and "Traceback" not in run.err
    assert _state(tmp_path) == before


def test_seal_of_a_sealed_topic_refuses(tmp_path):
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "1")
    dnb(*a, "seal", TOPIC)
    before = _state(tmp_path)
    run = dnb(*a, "seal", TOPIC)
    assert run.rc == 3 and "held by nobody" in run.err.replace("held by\nnobody", "held by nobody")
    assert _state(tmp_path) == before


def test_restore_of_a_topic_owned_elsewhere_refuses_and_changes_nothing(tmp_path):
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "3")
    before = _state(tmp_path)
    for command in (("restore", TOPIC), ("produce", TOPIC, "--count", "1"), ("upload", TOPIC),
                    ("consume", TOPIC, "--subscription", "s", "--ack")):
        run = dnb(*broker(tmp_path, "2"), *command)
        assert run.rc == 3, command
        assert "owned by broker 1" in run.err and "--takeover" in run.err
    assert _state(tmp_path) == before
    assert not os.path.exists(tmp_path / "broker-2" / "wal" / "default" / "reliable_topic")


def test_a_wrong_data_dir_refuses_and_never_records_the_owners_tail_lost(tmp_path):
    """Broker 1 acknowledged 3-4 durable only, in its data dir. A read-only command under
    the same broker id with another data dir (a typo) must refuse, writing nothing: a load
    there would record 3-4 lost and number after the archive, and the right dir's WAL would
    then be quarantined (atk33 F01). Accepting that loss is an explicit restore --takeover."""
    right = broker(tmp_path, "1")
    dnb(*right, "produce", TOPIC, "--count", "3")
    dnb(*right, "upload", TOPIC)
    dnb(*right, "produce", TOPIC, "--count", "2")  # 3-4 never archived
    typo = [*stores(tmp_path), "--broker-id", "1", "--data-dir", str(tmp_path / "broker-1-typo")]
    before = _state(tmp_path)
    for command in (("consume", TOPIC, "--subscription", "s", "--from", "earliest"),
                    ("produce", TOPIC, "--count", "1"), ("upload", TOPIC), ("restore", TOPIC),
                    ("seal", TOPIC), ("topic", "create", TOPIC)):
        run = dnb(*typo, *command)
        assert run.rc == 3, (command, run.err)
        assert "not in this data dir" in run.err and "--takeover" in run.err
    assert _state(tmp_path) == before
    run = dnb(*right, "--json", "consume", TOPIC, "--subscription", "s", "--from", "earliest")
    assert [m["offset"] for m in run.json()["messages"]] == [0, 1, 2, 3, 4]


def test_restore_takeover_is_the_failover_path(tmp_path):
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "3")
    dnb(*broker(tmp_path, "1"), "upload", TOPIC)
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "2")  # 3-4 never archived
    run = dnb(*broker(tmp_path, "2"), "--json", "restore", "--takeover", TOPIC)
    assert run.json() == {"next_offset": 3}
    assert _state(tmp_path)["owner"] == "2"


@pytest.mark.parametrize("name", ["../x", "/a/../b", "/a/b/c", "", "/", "/a/", "/a/b c", "/a/" + "x" * 300,
                                  "/./b", "/a/b\x00", "//etc/passwd", "/a\\b/c"])
def test_hostile_topic_names_are_refused_before_anything_is_created(tmp_path, name):
    for command in (("produce", name, "--count", "1"), ("seal", name), ("restore", name), ("verify", name),
                    ("consume", name, "--subscription", "s"), ("inspect", name), ("upload", name)):
        run = dnb("--data-dir", str(tmp_path / "d"), *command)
        assert run.rc == 2, (name, command, run.err)
        assert "topic name" in run.err and "Traceback" not in run.err
    assert not os.path.exists(tmp_path / "d")


@pytest.mark.parametrize("option,url,needle", [
    ("--metadata", "mysql://x/y", "unknown scheme 'mysql'"),
    ("--metadata", "/plain/path.db", "unknown scheme '(none)'"),
    ("--objects", "gs://bucket", "unknown scheme 'gs'"),
    ("--objects", "file://host/dir", "file:///abs/dir"),
    ("--metadata", "etcd://nohostport", "host:port"),
])
def test_bad_urls_exit_non_zero_with_a_clear_message(tmp_path, option, url, needle):
    run = dnb("--data-dir", str(tmp_path / "d"), option, url, "produce", TOPIC, "--count", "1")
    assert run.rc == 2 and needle in run.err and "Traceback" not in run.err
    assert not os.path.exists(tmp_path / "d" / "wal")


def test_a_bad_url_never_echoes_its_password(tmp_path):
    for debug in ((), ("--debug",)):
        run = dnb(*debug, "--data-dir", str(tmp_path / "d"), "--metadata", "etcds://root:s3cr3t-pw@127.0.0.1:2379",
                  "inspect", TOPIC)
        assert run.rc == 2 and "unknown scheme 'etcds'" in run.err and "***@127.0.0.1:2379" in run.err
        assert "s3cr3t-pw" not in run.err + run.out


def test_unreachable_etcd_is_unavailable_not_a_traceback(tmp_path):
    from tests.fixtures.servers import free_port

    run = dnb("--data-dir", str(tmp_path), "--metadata", f"etcd://127.0.0.1:{free_port()}", "inspect", TOPIC)
    assert run.rc in (2, 4) and run.err.startswith("dnb: ") and "Traceback" not in run.err


def test_debug_shows_the_traceback(tmp_path):
    run = dnb("--debug", *broker(tmp_path, "2"), "--metadata", "mysql://x", "seal", TOPIC)
    assert run.rc == 2
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "1")
    run = dnb("--debug", *broker(tmp_path, "2"), "seal", TOPIC)
    assert run.rc == 3 and "Traceback" in run.err


def test_usage_errors(tmp_path):
    assert dnb().rc == 2
    assert dnb("--help").rc == 0
    assert dnb("nosuch").rc == 2
    assert dnb("--data-dir", str(tmp_path), "consume", TOPIC, "--subscription", "s", "--from", "-3").rc == 2
    assert dnb("--data-dir", str(tmp_path), "--broker-id", "../1", "produce", TOPIC).rc == 2


def test_stores_helper_urls_are_absolute(tmp_path):
    assert stores(tmp_path)[1].startswith("sqlite:///")


def test_inspect_and_verify_show_the_lost_range_once_the_dead_broker_is_back(tmp_path):
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "3")
    dnb(*broker(tmp_path, "1"), "upload", TOPIC)
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "2")  # 3-4 never archived
    assert dnb(*broker(tmp_path, "2"), "--json", "restore", "--takeover", TOPIC).json() == {"next_offset": 3}
    # Broker 1 starts again (any command builds its host): its stale WAL is quarantined.
    dnb(*broker(tmp_path, "1"), "upload", TOPIC)
    info = dnb(*broker(tmp_path, "2"), "--json", "inspect", TOPIC).json()
    [lost] = info["lost_ranges"]
    # Every CLI invocation reloads the topic, so broker 1 held it last at epoch 3.
    qpath = str(tmp_path / "broker-1" / "wal" / ".quarantine" / "default" / "reliable_topic" / f"{3:020d}")
    assert lost["epoch"] == 3
    assert (lost["start_offset"], lost["end_offset"], lost["count"], lost["broker_id"], lost["exact"],
            lost["quarantine_path"]) == (3, 4, 2, "1", True, qpath)
    assert os.listdir(qpath)
    report = dnb(*broker(tmp_path, "2"), "--json", "verify", TOPIC).json()
    assert report["ok"] and [p["kind"] for p in report["problems"]] == ["lost_range"]
    assert "lost ranges (failovers):" in dnb(*broker(tmp_path, "2"), "inspect", TOPIC).out


# -- input validation, exit codes and JSON errors -----------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (("produce", TOPIC, "--count", "100000000000000000000000"), "above the limit"),
    (("produce", TOPIC, "--count", "1e23"), "not a whole number"),
    (("produce", "default/t", "--count", "1"), "must start with '/'"),
])
def test_bad_arguments_are_refused_before_anything_runs(tmp_path, argv, needle):
    run = dnb("--data-dir", str(tmp_path / "d"), *argv)
    assert run.rc == 2 and needle in run.err, run.err
    assert not os.path.exists(tmp_path / "d")


def test_bad_s3_url_options_are_usage_errors(tmp_path):
    for option in ("max_attempts=-3", "max_attempts=x", "read_timeout_s=0"):
        run = dnb("--data-dir", str(tmp_path / "d"), "--objects", f"s3://bucket/p?{option}", "inspect", TOPIC)
        assert run.rc == 2 and option.split("=")[0] in run.err and "Traceback" not in run.err, run.err


def test_a_corrupt_archive_object_is_a_data_error_with_a_json_error_object(tmp_path):
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "20", "--ack", "archived")
    assert dnb(*broker(tmp_path, "1"), "seal", TOPIC).rc == 0
    objects = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "objects") for f in fs if f.endswith(".dnb1")]
    assert objects
    with open(objects[0], "r+b") as f:
        f.seek(60)
        byte = f.read(1)
        f.seek(60)
        f.write(bytes([byte[0] ^ 0xFF]))
    run = dnb(*broker(tmp_path, "2"), "--json", "consume", TOPIC, "--subscription", "s", "--from", "0", "--max", "20")
    assert run.rc == 5, run.err
    error = run.json()["error"]
    assert error["exit_code"] == 5 and error["type"] and "Traceback" not in run.err


def test_a_second_process_on_the_same_data_dir_is_refused(tmp_path):
    from tiered.lifecycle import BrokerHost
    from tiered.metadata import open_metadata
    from tiered.objects import open_objects

    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "1")
    wal_root = next(os.path.join(d, n) for d, ns, _ in os.walk(tmp_path / "broker-1") for n in ns if n == "wal")
    metadata = open_metadata(f"sqlite:///{tmp_path}/other.db".replace("////", "///"))
    os.makedirs(tmp_path / "o", exist_ok=True)
    holder = BrokerHost("1", wal_root, metadata, open_objects(f"file://{tmp_path}/o"))
    try:
        run = dnb(*broker(tmp_path, "1"), "--json", "produce", TOPIC, "--count", "1")
        assert run.rc == 3 and run.json()["error"]["type"] == "WalLocked", (run.out, run.err)
    finally:
        holder.close()
        metadata.close()
    assert dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "1").rc == 0


def test_consume_below_the_archive_start_names_the_first_retained_offset(tmp_path):
    """Archive retention removed 0-1: consuming from 0 is a clear usage error (exit 2) whose
    JSON names the first retained offset; from 'earliest' it reads 2-3."""
    import time

    from tiered.metadata import keys, open_metadata

    a = broker(tmp_path, "1")
    for _ in range(2):  # archived acks: one object each (0-1, 2-3)
        assert dnb(*a, "produce", TOPIC, "--count", "2", "--ack", "archived").rc == 0
    with open_metadata(f"sqlite:///{tmp_path}/shared.db") as metadata:
        # What a cut leaves (start raised, then the descriptor below it deleted).
        metadata.put(keys.archive_start_key(TOPIC), keys.ArchiveStart(2, "1", 1, time.time()).to_json())
        metadata.delete(keys.descriptor_key(TOPIC, 0))
    run = dnb(*a, "--json", "consume", TOPIC, "--subscription", "s", "--from", "0")
    assert run.rc == 2
    error = run.json()["error"]
    assert (error["code"], error["type"], error["offset"], error["first_retained_offset"]) == (
        "usage", "OffsetBelowArchiveStart", 0, 2)
    assert "first retained offset is 2" in run.err
    got = dnb(*a, "--json", "consume", TOPIC, "--subscription", "s2").json()["messages"]
    assert [m["offset"] for m in got] == [2, 3]
    assert dnb(*a, "--json", "inspect", TOPIC).json()["archive_start"] == 2


def test_consume_ack_is_refused_when_the_read_began_past_the_subscriptions_position(tmp_path):
    """An ack is cumulative: after a read from 3, acknowledging 4 would acknowledge 0..2
    of the subscription unread (atk61 f01). Refused with nothing acknowledged; a read that
    begins at or before the position acknowledges as asked."""
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "5")
    run = dnb(*a, "--json", "consume", TOPIC, "--subscription", "s", "--from", "3", "--ack")
    assert run.rc == 3 and run.json()["error"]["code"] == "refused", (run.out, run.err)
    assert dnb(*a, "--json", "inspect", TOPIC).json()["cursors"].get("s", -1) == -1  # nothing acknowledged
    got = dnb(*a, "--json", "consume", TOPIC, "--subscription", "s", "--max", "2", "--ack").json()["messages"]
    assert [m["offset"] for m in got] == [0, 1]
    got = dnb(*a, "--json", "consume", TOPIC, "--subscription", "s", "--from", "1", "--ack").json()["messages"]
    assert [m["offset"] for m in got] == [1, 2, 3, 4]
    assert dnb(*a, "--json", "inspect", TOPIC).json()["cursors"] == {"s": 4}


def test_consume_ack_from_the_first_retained_offset_is_taken_when_retention_passed_the_cursor(tmp_path):
    """Retention removed the offsets after the cursor: reading from the first retained
    offset skips nothing that can still be read, so its ack is taken."""
    import time

    from tiered.metadata import keys, open_metadata

    a = broker(tmp_path, "1")
    for _ in range(2):  # archived acks: one object each (0-1, 2-3)
        assert dnb(*a, "produce", TOPIC, "--count", "2", "--ack", "archived").rc == 0
    assert dnb(*a, "consume", TOPIC, "--subscription", "s", "--max", "1", "--ack").rc == 0  # cursor 0
    with open_metadata(f"sqlite:///{tmp_path}/shared.db") as metadata:
        metadata.put(keys.archive_start_key(TOPIC), keys.ArchiveStart(2, "1", 1, time.time()).to_json())
        metadata.delete(keys.descriptor_key(TOPIC, 0))
    run = dnb(*a, "--json", "consume", TOPIC, "--subscription", "s", "--from", "2", "--ack")
    assert run.rc == 0, (run.out, run.err)
    assert [m["offset"] for m in run.json()["messages"]] == [2, 3]
    assert dnb(*a, "--json", "inspect", TOPIC).json()["cursors"] == {"s": 3}


def test_a_malformed_record_found_during_a_load_exits_data_not_internal(tmp_path):
    """A damaged cursor record fails the load (LoadError wrapping MalformedRecord): that is
    damaged data (exit 5), not an internal error (70) (atk33 F03)."""
    from tiered.metadata import keys, open_metadata

    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "3")
    dnb(*a, "consume", TOPIC, "--subscription", "s", "--from", "earliest", "--ack")
    metadata = open_metadata(f"sqlite:///{tmp_path}/shared.db".replace("////", "///"))
    try:
        metadata.put(keys.cursor_key(TOPIC, "s"), b'{"last_acked_offset": "1"}')
    finally:
        metadata.close()
    for command in (("consume", TOPIC, "--subscription", "s"), ("produce", TOPIC, "--count", "1")):
        run = dnb(*a, "--json", *command)
        assert run.rc == 5 and run.json()["error"]["code"] == "data", (command, run.out)


@pytest.mark.parametrize("command", [
    ("produce", TOPIC, "--count", "1", "--size", "999999999999"),
    ("consume", TOPIC, "--subscription", "s", "--follow", "--idle-timeout-s", "nan"),
    ("consume", TOPIC, "--subscription", "s", "--follow", "--idle-timeout-s", "-1"),
    ("cluster", "assign", TOPIC, "--to", "../x"),
])
def test_out_of_range_options_are_usage_errors_before_anything_happens(tmp_path, command):
    """An option no command can honour is refused as bad usage (exit 2) before any work:
    a --size past the largest message allocated it first (MemoryError, exit 70), a NaN
    idle timeout never expired, a broker id that is no id was stored (atk33 F06)."""
    run = dnb(*broker(tmp_path, "1"), *command)
    assert run.rc == 2, (command, run.out, run.err)
    assert "Traceback" not in run.err
    assert dnb(*broker(tmp_path, "1"), "--json", "topic", "list").json() == {"topics": []}


def test_unsubscribe_on_the_owner_and_on_a_sealed_topic(tmp_path):
    a, b = broker(tmp_path, "1"), broker(tmp_path, "2")
    dnb(*a, "produce", TOPIC, "--count", "3")
    dnb(*a, "consume", TOPIC, "--subscription", "s", "--max", "2", "--ack")
    dnb(*a, "consume", TOPIC, "--subscription", "t", "--max", "1", "--ack")
    assert dnb(*a, "--json", "inspect", TOPIC).json()["cursors"] == {"s": 1, "t": 0}
    refused = dnb(*b, "unsubscribe", TOPIC, "--subscription", "s")
    assert refused.rc == 3 and "owned by broker 1" in refused.err  # only through the owner
    assert dnb(*a, "--json", "unsubscribe", TOPIC, "--subscription", "s").json() == \
        {"subscription": "s", "deleted": True}
    assert dnb(*a, "--json", "inspect", TOPIC).json()["cursors"] == {"t": 0}
    assert dnb(*a, "seal", TOPIC).rc == 0  # nobody owns it now: fenced on it staying unowned
    assert dnb(*b, "--json", "unsubscribe", TOPIC, "--subscription", "t").json()["deleted"] is True
    run = dnb(*b, "unsubscribe", TOPIC, "--subscription", "t")
    assert run.rc == 0 and "deleted       no" in run.out
    assert dnb(*b, "--json", "inspect", TOPIC).json()["cursors"] == {}


def test_fencing_on_an_unowned_topic_is_built_from_the_read_that_found_it_unowned(tmp_path):
    """atk75 F1: the CLI read the owner record to find the topic unowned, then read it again
    to fence: a broker taking the topic in between had its cursor deleted under its own
    record's fence. The one read now refuses a held record (TopicHeld)."""
    from tiered.errors import TopicHeld
    from tiered.lifecycle.ownership import acquire, unowned_fencing
    from tiered.metadata import open_metadata
    from wal.topics import TopicName

    metadata = open_metadata(f"sqlite://{tmp_path}/metadata.db")
    topic = TopicName.parse(TOPIC)
    assert unowned_fencing(metadata, topic)  # never owned: fenced on staying so
    acquire(metadata, topic, "2")
    with pytest.raises(TopicHeld) as held:
        unowned_fencing(metadata, topic)
    assert held.value.holder == "2"
    metadata.close()


def test_no_broker_answering_is_an_unavailable_exit_naming_the_way_out():
    from tiered.broker.client import BrokerUnavailable
    from tiered.tools.cli.output import EXIT_UNAVAILABLE, classify

    code, message = classify(BrokerUnavailable("no broker served /default/t within 60s"))
    assert code == EXIT_UNAVAILABLE and "without --broker" in message
