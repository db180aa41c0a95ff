"""A real broker process, SIGSTOPped past its lease on a real etcd, never acknowledges
after another broker took its topic over.

The owner runs in its own process and prints every acknowledgement. The test pauses it
until its lease has expired on the etcd server, takes the topic over from this process
(epoch + 1) and produces there, then resumes the owner. From then on the owner may
complete at most the one produce that was already past its ownership check when it was
frozen (its offset is then part of its unarchived tail, recorded as lost when it
retires its WAL); every later produce must fail.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from tiered.lifecycle import BrokerHost
from tiered.lifecycle.ownership import is_broker_registered
from tiered.metadata import open_metadata
from tiered.objects import open_objects

from tests.tiered.helpers_lifecycle import FAST_BROKER, TOPIC

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TTL_S = 2.0
HANG_GUARD_S = 90.0

OWNER = textwrap.dedent("""
    import sys, time
    from dataclasses import replace
    sys.path.insert(0, {repo!r})
    from tests.tiered.helpers_lifecycle import FAST_BROKER
    from tiered.lifecycle import BrokerHost
    from tiered.metadata import open_metadata
    from tiered.objects import open_objects

    host = BrokerHost("A", {wal!r}, open_metadata({md!r}), open_objects({obj!r}),
                      replace(FAST_BROKER, session_ttl_s={ttl}))
    topic = host.load({topic!r})
    print("loaded", flush=True)
    i = 0
    while True:
        try:
            offset = topic.produce(b"a-%d" % i, timeout_s=1.0)
            print("ack", offset, time.monotonic(), flush=True)
        except Exception as e:
            print("refused", type(e).__name__, time.monotonic(), flush=True)
            if topic.fenced:
                print("fenced", flush=True)
                time.sleep(600)
        i += 1
""")


@pytest.mark.etcd
@pytest.mark.s3
def test_a_paused_owner_whose_lease_lapsed_acknowledges_nothing_after_the_takeover(
        tmp_path, etcd_server, moto_server, s3_bucket) -> None:
    md_url = f"{etcd_server.url}/t-{uuid.uuid4().hex[:12]}"
    obj_url = f"s3://{s3_bucket}/dnb?endpoint={moto_server.endpoint_url}&region=us-east-1"
    code = OWNER.format(repo=REPO, wal=str(tmp_path / "wal-A"), md=md_url, obj=obj_url, ttl=TTL_S, topic=TOPIC)
    env = {**os.environ, "PYTHONPATH": REPO, "GRPC_VERBOSITY": "ERROR"}
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    metadata = open_metadata(md_url)
    b = None
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "loaded"
        acks_before = [owner.stdout.readline() for _ in range(20)]
        assert all(line.startswith("ack") for line in acks_before), acks_before
        owner.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + HANG_GUARD_S
        while is_broker_registered(metadata, "A"):
            assert time.monotonic() < deadline, "hang guard: A's lease never expired"
            time.sleep(0.05)
        b = BrokerHost("B", str(tmp_path / "wal-B"), metadata, open_objects(obj_url), FAST_BROKER)
        topic_b = b.load(TOPIC)
        start_b = topic_b.next_offset
        for _ in range(5):
            topic_b.produce(b"b")
        resumed = time.monotonic()  # CLOCK_MONOTONIC is one clock for every process on the host
        owner.send_signal(signal.SIGCONT)
        after: list[str] = []
        while True:
            line = owner.stdout.readline()
            assert line, f"owner exited early: {after}"
            after.append(line.strip())
            if line.strip() == "fenced":
                break
            assert time.monotonic() < deadline + HANG_GUARD_S, f"hang guard: {after}"
        # Lines written before the pause may still sit in the pipe: judge by the time the
        # owner printed them, not by when they were read.
        acks_after = [line for line in after if line.startswith("ack") and float(line.split()[2]) >= resumed]
        assert len(acks_after) <= 1, f"the paused owner acknowledged after resuming: {after}"
        # The ack buffered before the pause (if any) named an offset before B's restart
        # point or inside A's unarchived tail; never one B wrote after the takeover
        # while A was acknowledging.
        assert topic_b.next_offset == start_b + 5
    finally:
        owner.send_signal(signal.SIGCONT)
        owner.kill()
        owner.wait(30)
        if b is not None:
            b.close()
        metadata.close()
