"""Two real ``dnb broker run`` processes, a client producing and reading through them,
and a topic moving between them while the client keeps going."""
from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from tests.cli.helpers import REPO, dnb
from tests.fixtures.servers import free_port
from tiered.broker.client import SyncBrokerClient

TOPIC = "/default/orders"
HANG_GUARD_S = 90.0


class Broker:
    """One ``dnb broker run`` process; ``wait=False`` returns at once (call
    :meth:`wait_ready`), so several brokers start in parallel."""

    def __init__(self, root, broker_id: str, port: int | None = None, stores: tuple[str, str] | None = None,
                 wait: bool = True) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        metadata, objects = stores or (f"sqlite:///{root}/shared.db", f"file://{root}/objects")
        self.stores = (metadata, objects)
        self.argv = ["--data-dir", str(root / f"broker-{broker_id}"), "--metadata", metadata,
                     "--objects", objects, "--broker-id", broker_id]
        env = {**os.environ, "PYTHONPATH": REPO, "GRPC_VERBOSITY": "ERROR"}
        # The log goes to a file, not a pipe: nobody reads a pipe while the test runs, and
        # a full one would block the broker (a hang that depends on how much it logged).
        self.log_path = root / f"broker-{broker_id}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tiered.tools.cli.main", *self.argv, "broker", "run",
                                          "--listen", f"127.0.0.1:{self.port}"], env=env, cwd=REPO,
                                         stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> "Broker":
        """Until ``/healthz`` answers (it serves once the broker registered); bounded."""
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            assert self.proc.poll() is None, self.log()
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if json.load(r)["ok"]:
                        return self
            except OSError:
                pass
            assert time.monotonic() < deadline, "hang guard: broker did not start: " + self.log()
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def topics(self) -> list[str]:
        with urllib.request.urlopen(self.url + "/topics", timeout=10) as r:
            return [t["topic"] for t in json.load(r)["topics"]]

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(HANG_GUARD_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def wait_all_ready(brokers: list[Broker]) -> None:
    """Wait for every broker started with ``wait=False``; if one does not start, kill them
    all before raising, so no broker process outlives the test."""
    try:
        for broker in brokers:
            broker.wait_ready()
    except BaseException:
        for broker in brokers:
            broker.proc.kill()
            broker.proc.wait()
        raise


def _read_all(client: SyncBrokerClient, start: int, count: int) -> list[int]:
    seen, position = [], start
    deadline = time.monotonic() + HANG_GUARD_S
    while len(seen) < count:
        batch = client.read(TOPIC, position, max_messages=100, wait_s=0.5)
        seen += [m["offset"] for m in batch.messages]
        position = batch.next_offset
        assert time.monotonic() < deadline, f"hang guard: read {seen}"
    return seen


def _raw_get(url: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """One request, redirects NOT followed (what a plain HTTP client sees)."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_a_topic_moves_between_two_broker_processes_under_a_live_client(tmp_path) -> None:
    os.makedirs(tmp_path / "objects")
    one, two = Broker(tmp_path, "1", wait=False), Broker(tmp_path, "2", wait=False)
    wait_all_ready([one, two])
    a = one.argv
    path = "/topics/default/orders/messages?from=0"
    try:
        from tiered.lifecycle.watcher import assign
        from tiered.metadata import open_metadata

        # Nobody owns the topic yet: 503 with Retry-After and a JSON reason, never an empty 200.
        status, headers, body = _raw_get(two.url, path)
        assert (status, headers.get("Retry-After"), json.loads(body)["error"]["type"]) == (503, "1", "Unavailable")
        metadata = open_metadata(f"sqlite:///{tmp_path}/shared.db")
        assign(metadata, TOPIC, "1")
        metadata.close()
        with SyncBrokerClient([two.url], timeout_s=60) as client:  # asks the wrong broker first
            assert client.produce(TOPIC, [b"m%d" % i for i in range(20)]) == list(range(20))
            assert one.topics() == [TOPIC]
            # Broker 2 does not own it: 307 to the owner's advertised address, same path.
            status, headers, _ = _raw_get(two.url, path)
            assert (status, headers.get("Location")) == (307, one.url + path)
            moved = dnb(*a, "--json", "move", TOPIC, "--to", "2")
            assert moved.rc == 0, moved.err
            assert moved.json()["last_committed_offset"] == 19
            offsets = client.produce(TOPIC, [b"m%d" % i for i in range(20, 40)], ack="archived")
            assert offsets == list(range(20, 40))
            assert two.topics() == [TOPIC]
            assert _read_all(client, 0, 40) == list(range(40))
            assert client.ack(TOPIC, "billing", 39) == 39
        # The CLI as a client: broker 1 no longer owns the topic and redirects to 2.
        produced = dnb("--json", "produce", TOPIC, "--count", "5", "--broker", one.url)
        assert produced.rc == 0 and produced.json() == {"first_offset": 40, "last_offset": 44}, produced.err
        consumed = dnb("--json", "consume", TOPIC, "--subscription", "cli", "--from", "38", "--broker", one.url)
        assert [m["offset"] for m in consumed.json()["messages"]] == [38, 39, 40, 41, 42, 43, 44]
        # An ack is cumulative: acknowledging 44 after a read from 38 would acknowledge
        # 0..37 of the new subscription unread. Refused, and nothing acknowledged.
        refused = dnb("--json", "consume", TOPIC, "--subscription", "cli", "--from", "38", "--ack", "--broker", one.url)
        assert refused.rc == 3, (refused.out, refused.err)
        # Without --from it reads from the subscription's position; acked, a second run
        # gets nothing again (the README's command, run twice).
        for expected in (list(range(45)), []):
            consumed = dnb("--json", "consume", TOPIC, "--subscription", "cli", "--ack", "--broker", one.url)
            assert consumed.rc == 0, consumed.err
            assert [m["offset"] for m in consumed.json()["messages"]] == expected
    finally:
        codes = [one.terminate(), two.terminate()]
    assert codes == [0, 0]
    verify = dnb(*a, "--json", "verify", TOPIC)
    assert verify.rc == 0 and verify.json()["ok"], verify.out
    state = dnb(*a, "--json", "inspect", TOPIC).json()
    assert state["sealed_state"]["sealed"] and state["sealed_state"]["last_committed_offset"] == 44
    assert state["owner"] is None  # SIGTERM sealed it and released ownership


def test_a_second_broker_process_on_the_same_data_dir_is_refused(tmp_path) -> None:
    os.makedirs(tmp_path / "objects")
    one = Broker(tmp_path, "1")
    try:
        run = dnb(*one.argv, "--json", "broker", "run", "--listen", f"127.0.0.1:{free_port()}")
        assert run.rc == 3, (run.out, run.err)
    finally:
        assert one.terminate() == 0
