"""Broker crashes by SIGKILL: a real broker subprocess on the real disk, killed mid-produce.

The worker (``python -m tiered.tools.harness.subproc ...``) loads the topic, appends messages
one by one and prints ``<offset> <payload>`` after each is durable, flushing stdout, so
the parent knows exactly which messages were acknowledged when it kills the process.
"""
from __future__ import annotations

import argparse
import os
import selectors
import signal
import subprocess
import sys
import time
from tiered.lifecycle import BrokerHost
from tiered.metadata import open_metadata
from tiered.objects import open_objects
from tiered.tools.harness.cluster import CrashHook, _config
from typing import Any

#: Bound on how long the parent waits for the worker to load the topic and start.
WORKER_START_TIMEOUT_S = 30.0


def kill_broker_mid_produce(scenario: Any, index: int, count: int, after_s: float) -> list[tuple[int, bytes]]:
    """Start the worker as broker ``index``, SIGKILL it ``after_s`` after its first ack.

    Returns the (offset, payload) pairs it reported durable before dying.
    """
    cluster = scenario.cluster
    cmd = [sys.executable, "-m", "tiered.tools.harness.subproc", "--metadata", cluster.metadata_url,
           "--objects", cluster.objects_url, "--wal-root", cluster.wal_root(index),
           "--broker-id", cluster.broker_id(index), "--topic", str(cluster.topic),
           "--count", str(count), "--prefix", f"seed{scenario.seed}-k{scenario.model.payload_counter}-"]
    env = {**os.environ, "GRPC_VERBOSITY": "ERROR"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    scenario.model.payload_counter += count
    try:
        return _collect_until_kill(proc, after_s)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WORKER_START_TIMEOUT_S)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def _collect_until_kill(proc: subprocess.Popen, after_s: float) -> list[tuple[int, bytes]]:
    reported: list[tuple[int, bytes]] = []
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    kill_at: float | None = None
    buffer = b""
    while True:
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            os.kill(proc.pid, signal.SIGKILL)
            break
        if now >= deadline:
            raise TimeoutError("the broker worker did not report in time")
        timeout = min(0.05, (kill_at or deadline) - now)
        if not selector.select(max(timeout, 0.0)):
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
        if not chunk:
            break  # the worker finished every message before the kill
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            offset, _, payload = line.partition(b" ")
            reported.append((int(offset), payload))
        if reported and kill_at is None:
            kill_at = time.monotonic() + after_s
    selector.close()
    proc.wait(WORKER_START_TIMEOUT_S)
    # Lines written before the kill may still sit in the pipe: they were acked too.
    rest = buffer + proc.stdout.read()  # type: ignore[union-attr]
    for line in rest.split(b"\n"):
        if line.strip() and b" " in line:
            offset, _, payload = line.partition(b" ")
            if offset.isdigit():
                reported.append((int(offset), payload))
    return reported


def _worker(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    for name in ("--metadata", "--objects", "--wal-root", "--broker-id", "--topic", "--prefix"):
        parser.add_argument(name, required=True)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)

    host = BrokerHost(args.broker_id, args.wal_root, open_metadata(args.metadata), open_objects(args.objects),
                      _config(CrashHook()))
    hosted = host.load(args.topic)
    out = sys.stdout.buffer
    for i in range(args.count):
        payload = f"{args.prefix}{i}".encode()
        offset = hosted.produce(payload)
        out.write(b"%d %s\n" % (offset, payload))
        out.flush()
    os._exit(0)  # like a crash after the last ack: no seal, no clean close


if __name__ == "__main__":
    sys.exit(_worker())
