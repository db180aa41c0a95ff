"""A minimal asyncio broker embedding dnb-storage.

Run it (embedded stores in a temp dir, no servers needed)::

    PYTHONPATH=. python examples/asyncio_broker.py

or against real servers::

    PYTHONPATH=. python examples/asyncio_broker.py --metadata etcd://127.0.0.1:2379 \
        --objects 's3://bucket/dnb?endpoint=http://127.0.0.1:5000'

It hosts whatever the cluster assigns to it (``/cluster/brokers/<id>/...``), so the
demo assigns itself one topic, produces with both ack levels, tails it with a
subscription, then moves the topic to a second broker in the same process and resumes.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile

from tiered.lifecycle.config import BrokerConfig
from tiered.lifecycle import BrokerHost
from tiered.metadata import open_metadata
from tiered.objects import open_objects
from tiered.lifecycle.watcher import AssignmentWatcher, assign, request_unload, wait_sealed

TOPIC = "/default/demo"


async def consume(host: BrokerHost, subscription: str, count: int) -> None:
    """Read ``count`` messages from the subscription's cursor on, ack each."""
    hosted = host.topic(TOPIC)
    sub = hosted.subscribe(subscription, initial="earliest")
    async with hosted.create_reader(sub.cursor + 1) as reader:
        async for message in reader:
            print(f"  {host.broker_id} served {message.offset} from {message.tier}: {message.payload!r}")
            sub.ack(message.offset)
            count -= 1
            if count == 0:
                return


async def wait_hosted(host: BrokerHost, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if any(str(t.topic) == TOPIC for t in host.topics()):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{host.broker_id} never loaded {TOPIC}")


async def main(metadata_url: str, objects_url: str, wal_dir: str) -> None:
    metadata, objects = open_metadata(metadata_url), open_objects(objects_url)
    brokers = {b: BrokerHost(b, f"{wal_dir}/{b}", metadata, objects, BrokerConfig()) for b in ("A", "B")}
    watchers = [AssignmentWatcher(host).start() for host in brokers.values()]
    try:
        assign(metadata, TOPIC, "A")
        await wait_hosted(brokers["A"])
        topic = brokers["A"].topic(TOPIC)
        for i in range(5):
            await topic.produce_async(b"hello %d" % i)  # ack: durable (fsynced)
        await topic.produce_async(b"kept even if A's disk dies", ack="archived")
        await consume(brokers["A"], "demo-sub", 4)

        print("moving the topic A -> B")
        await asyncio.to_thread(request_unload, metadata, TOPIC, "A", "demo move")
        await asyncio.to_thread(wait_sealed, metadata, TOPIC, 30.0)
        assign(metadata, TOPIC, "B")
        await wait_hosted(brokers["B"])
        topic = brokers["B"].topic(TOPIC)
        print(f"B continues at offset {topic.next_offset}")
        await topic.produce_async(b"hello from B")
        await consume(brokers["B"], "demo-sub", 3)  # 4, 5 from the archive, 6 from B's WAL
    finally:
        for watcher in watchers:
            watcher.stop()
        for host in brokers.values():
            await host.close_async(unload=True)
        metadata.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    tmp = tempfile.mkdtemp(prefix="dnb-demo-")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", default=f"sqlite:///{tmp}/metadata.db")
    parser.add_argument("--objects", default=f"file://{tmp}/objects")
    parser.add_argument("--wal-dir", default=f"{tmp}/wal")
    args = parser.parse_args()
    asyncio.run(main(args.metadata, args.objects, args.wal_dir))
