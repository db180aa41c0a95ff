"""Three broker processes, a producer and a consumer running through the client, the
topic moved around them and its owner SIGKILLed and restarted mid-run: every
acknowledged offset is read back exactly once, with its payload, offsets contiguous
across the whole history, and verify is OK."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest

from tests.broker.test_broker_process import HANG_GUARD_S, TOPIC, Broker
from tests.cli.helpers import dnb
from tiered.broker.client import BrokerRequestError, BrokerUnavailable, SyncBrokerClient

MOVES = 6


@pytest.fixture(params=["local", "etcd+s3"])
def stores(request, tmp_path) -> tuple[str, str]:
    os.makedirs(tmp_path / "objects")
    if request.param == "local":
        return f"sqlite:///{tmp_path}/shared.db", f"file://{tmp_path}/objects"
    etcd = request.getfixturevalue("etcd_server")
    moto = request.getfixturevalue("moto_server")
    bucket = request.getfixturevalue("s3_bucket")
    return (f"{etcd.url}/t-{uuid.uuid4().hex[:12]}",
            f"s3://{bucket}/dnb?endpoint={moto.endpoint_url}&region=us-east-1")


def test_moves_and_a_sigkilled_owner_under_a_live_producer_and_consumer(tmp_path, stores) -> None:
    brokers = {i: Broker(tmp_path, str(i), stores=stores) for i in (1, 2, 3)}
    urls = [b.url for b in brokers.values()]
    argv = brokers[1].argv
    acked: dict[int, bytes] = {}
    read: list[tuple[int, bytes]] = []
    stop = threading.Event()
    errors: list[str] = []

    def produce() -> None:
        with SyncBrokerClient(urls, timeout_s=HANG_GUARD_S) as client:
            i = 0
            while not stop.is_set():
                payload = b"p%d" % i
                try:
                    [offset] = client.produce(TOPIC, [payload], ack="durable" if i % 3 else "archived")
                    assert offset not in acked, f"offset {offset} acknowledged twice"
                    acked[offset] = payload
                except (BrokerUnavailable, BrokerRequestError, OSError) as e:
                    errors.append(f"produce {i}: {type(e).__name__}")  # not acknowledged: allowed
                except Exception as e:  # noqa: BLE001 - e.g. the connection died mid-request
                    errors.append(f"produce {i}: {type(e).__name__}: {e}")
                i += 1

    def consume() -> None:
        with SyncBrokerClient(urls, timeout_s=HANG_GUARD_S) as client:
            position = 0
            while not stop.is_set() or position < (max(acked) + 1 if acked else 0):
                try:
                    batch = client.read(TOPIC, position, max_messages=500, wait_s=0.2)
                except (BrokerUnavailable, OSError, Exception) as e:  # noqa: BLE001 - retried below
                    errors.append(f"read at {position}: {type(e).__name__}")
                    time.sleep(0.05)
                    continue
                read.extend((m["offset"], m["payload"]) for m in batch.messages)
                position = batch.next_offset

    try:
        from tiered.lifecycle.watcher import assign
        from tiered.metadata import open_metadata

        metadata = open_metadata(stores[0])
        assign(metadata, TOPIC, "1")
        metadata.close()
        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for t in threads:
            t.start()
        owner = 1
        for step in range(MOVES):
            time.sleep(0.5)
            target = owner % 3 + 1
            moved = dnb(*argv, "--json", "move", TOPIC, "--to", str(target))
            assert moved.rc == 0, moved.err
            owner = target
            if step == MOVES // 2:  # the owner dies mid-run and comes back (same id, same disk)
                time.sleep(0.3)
                brokers[owner].proc.send_signal(signal.SIGKILL)
                brokers[owner].proc.wait(HANG_GUARD_S)
                brokers[owner] = Broker(tmp_path, str(owner), port=brokers[owner].port, stores=stores)
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(HANG_GUARD_S * 2)
            assert not t.is_alive(), "hang guard: a client thread never finished"
    finally:
        stop.set()
        codes = [b.terminate() for b in brokers.values()]
    assert codes == [0, 0, 0]
    offsets = [o for o, _ in read]
    assert offsets == list(range(len(offsets))), "read offsets are not contiguous or not once each"
    got = dict(read)
    missing = sorted(set(acked) - set(got))
    assert not missing, f"acknowledged offsets never read: {missing[:10]}"
    wrong = [o for o, p in acked.items() if got[o] != p]
    assert not wrong, f"acknowledged offsets read with another payload: {wrong[:10]}"
    assert len(acked) > 50, f"too little traffic to mean anything ({len(acked)} acks; {errors[:5]})"
    verify = dnb(*argv, "--json", "verify", TOPIC)
    assert verify.rc == 0 and verify.json()["ok"], verify.out
