"""``dnb topic create|delete|list``, ``auto_create`` off and ``inspect`` of unknown topics."""
from __future__ import annotations

from tests.cli.helpers import dnb, stores

TOPIC = "/default/reliable_topic"


def _on(tmp_path, broker_id: str = "1") -> list[str]:
    return [*stores(tmp_path), "--broker-id", broker_id, "--data-dir", str(tmp_path / f"broker-{broker_id}")]


def test_inspect_of_a_topic_that_does_not_exist_exits_not_found(tmp_path) -> None:
    run = dnb(*_on(tmp_path), "--json", "inspect", "/default/no_such_topic")
    assert run.rc == 7 and run.json()["error"]["code"] == "not_found"
    assert dnb(*_on(tmp_path), "--json", "topic", "list").json() == {"topics": []}  # inspect wrote nothing


def test_auto_create_off_refuses_produce_and_consume_and_writes_nothing(tmp_path) -> None:
    off = ["--set", "broker.auto_create=false"]
    run = dnb(*_on(tmp_path), *off, "--json", "produce", "/default/typo", "--count", "1")
    assert run.rc == 7 and run.json()["error"]["type"] == "TopicNotFound"
    run = dnb(*_on(tmp_path), *off, "--json", "consume", "/default/typo", "--subscription", "s")
    assert run.rc == 7
    assert dnb(*_on(tmp_path), "--json", "topic", "list", "--deleted").json() == {"topics": []}
    created = dnb(*_on(tmp_path), *off, "--json", "topic", "create", TOPIC).json()
    assert created["created"] is True and created["next_offset"] == 0
    assert dnb(*_on(tmp_path), *off, "--json", "produce", TOPIC, "--count", "2").json()["last_offset"] == 1


def test_topic_delete_list_and_recreate(tmp_path) -> None:
    dnb(*_on(tmp_path), "produce", TOPIC, "--count", "5", "--ack", "archived")
    [row] = dnb(*_on(tmp_path), "--json", "topic", "list").json()["topics"]
    assert (row["topic"], row["status"], row["first_offset"], row["last_offset"]) == (TOPIC, "owned", 0, 4)
    assert row["archived_bytes"] > 0
    # Broker 2 may not delete what broker 1 holds.
    refused = dnb(*_on(tmp_path, "2"), "--json", "topic", "delete", TOPIC)
    assert refused.rc == 3
    report = dnb(*_on(tmp_path), "--json", "topic", "delete", TOPIC).json()
    assert (report["outcome"], report["next_offset"]) == ("deleted", 5)
    assert dnb(*_on(tmp_path), "--json", "topic", "delete", TOPIC).json()["outcome"] == "already_deleted"
    assert dnb(*_on(tmp_path), "--json", "topic", "list").json() == {"topics": []}
    assert dnb(*_on(tmp_path), "--json", "inspect", TOPIC).rc == 7
    assert dnb(*_on(tmp_path), "--json", "produce", TOPIC, "--count", "1").rc == 7  # never re-created implicitly
    created = dnb(*_on(tmp_path, "2"), "--json", "topic", "create", TOPIC).json()
    assert created["next_offset"] == 5 and created["epoch"] > 1
