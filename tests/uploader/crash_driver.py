"""Crash driver: many rounds of "append, upload, SIGKILL at a random step", then verify.

Run as ``python -m tests.uploader.crash_driver DIR ROUNDS SEED``; prints one JSON line.
It forks one child per round (cheap; no interpreter start-up). The driver itself holds no
threads or open stores while forking. Every round the child reopens the real WAL (torn-tail
recovery included), appends a few deterministic messages, makes them durable, and runs
the uploader with a fault hook that SIGKILLs the process at a random step (or inside the
object store's publish). Between rounds the driver checks that descriptors never overlap
or leave a gap. At the end it archives the rest without faults and verifies everything.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys

PUBLISH_TIME_MS = 1_700_000_000_000
TOPIC = "/crash/t"


def payload(offset: int) -> bytes:
    return (f"msg-{offset}-".encode() * 8)[: 40 + offset % 50]


def expected_frames(first: int, last: int) -> bytes:
    import native

    return b"".join(native.encode_frame(o, PUBLISH_TIME_MS, None, None, payload(o))
                    for o in range(first, last + 1))


#: ``<metadata url> <objects url>``: run on real servers (etcd + S3 over HTTP) instead of
#: SQLite + a local directory. gRPC does not survive ``fork()``, so in this mode the
#: driver itself never opens a store: setup, checks and the final verify run in forked
#: children too.
REMOTE_ENV = "DNB_CRASH_STORES"


def remote() -> bool:
    return bool(os.environ.get(REMOTE_ENV))


_remote_objects = None


def prepare_remote() -> None:
    """In the driver, before any fork: import the clients and build the S3 store once
    (botocore's model loading costs ~0.3 s; the store has made no request, so it holds
    no socket and is safe to inherit). No gRPC channel is ever opened here."""
    global _remote_objects
    import tiered.metadata.etcd  # noqa: F401 - import cost paid once
    from tiered.objects import open_objects

    _remote_objects = open_objects(os.environ[REMOTE_ENV].split()[1])


class _Borrowed:
    """The inherited S3 store: children must not close it for the others."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def close(self) -> None:
        pass


def open_stores(root: str):
    if remote():
        from tiered.metadata import open_metadata
        from tiered.objects import open_objects

        meta_url, objects_url = os.environ[REMOTE_ENV].split()
        objects = _Borrowed(_remote_objects) if _remote_objects is not None else open_objects(objects_url)
        return open_metadata(meta_url), objects
    from tiered.metadata.sqlite import SqliteMetadataStore
    from tiered.objects.local import LocalObjectStore

    return SqliteMetadataStore(os.path.join(root, "meta.db")), LocalObjectStore(os.path.join(root, "objects"))


def forked(fn, *args):
    """Run ``fn(*args)`` in a forked child when remote (else here); its stdout is shared."""
    if not remote():
        return fn(*args)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            fn(*args)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 3
        sys.stdout.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{getattr(fn, '__name__', fn)} failed in a child: status {status}")
    return None


def fencing():
    from tiered.metadata import keys
    from tiered.metadata.base import value_is

    owner = keys.Ownership("1", 3, 1.0)
    return owner, [value_is(keys.owner_key(TOPIC), owner.to_json())]


def child(root: str, rng: random.Random, kill_at: int) -> None:
    from prometheus_client import CollectorRegistry

    from uploader import RetentionConfig, Uploader, UploaderConfig, UploaderMetrics, collect_garbage
    from wal import WriteAheadLog
    from wal.config import WalConfig

    steps = {"n": 0}

    def hook(step: str) -> None:
        steps["n"] += 1
        if steps["n"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    metadata, objects = open_stores(root)
    if rng.random() < 0.2 and hasattr(objects, "before_publish"):
        objects.before_publish = lambda tmp: hook("publish")  # die with a temp file, unpublished
    wal = WriteAheadLog.open(os.path.join(root, "wal"), TOPIC, WalConfig(segment_bytes_max=4_096))
    for _ in range(rng.randint(0, 40)):
        wal.append(payload(wal.next_offset), publish_time=PUBLISH_TIME_MS)
    wal.flush(10)
    if rng.random() < 0.2:
        collect_garbage(metadata, objects, TOPIC, grace_s=0)  # GC racing crashes must stay safe
    config = UploaderConfig(object_bytes_max=rng.choice([600, 2_000, 8_000]), compression="none",
                            retention=RetentionConfig(age_max_s=0), fault_hook=hook, retry_backoff_s=0.001)
    _, fence = fencing()
    Uploader(TOPIC, wal, metadata, objects, broker_id=1, fencing=fence, config=config,
             committed_through=None, metrics=UploaderMetrics(CollectorRegistry())).upload_once()
    os._exit(0)


def check_chain(root: str) -> int | None:
    from tiered.archive import list_descriptors

    metadata, objects = open_stores(root)
    try:
        descriptors = list_descriptors(metadata, TOPIC)
    finally:
        metadata.close()
        objects.close()
    for prev, cur in zip(descriptors, descriptors[1:]):
        assert cur.start_offset == prev.end_offset + 1, f"gap/overlap: {prev} then {cur}"
    assert not descriptors or descriptors[0].start_offset == 0
    return descriptors[-1].end_offset if descriptors else None


def verify(root: str) -> dict:
    from prometheus_client import CollectorRegistry

    from tiered.archive import list_descriptors
    from tiered.archive.fetch import object_frames
    from tiered.archive.naming import object_key
    from tiered.archive.orphans import find_orphans
    from uploader import Uploader, UploaderConfig, UploaderMetrics, collect_garbage
    from wal import WriteAheadLog

    metadata, objects = open_stores(root)
    wal = WriteAheadLog.open(os.path.join(root, "wal"), TOPIC)
    _, fence = fencing()
    up = Uploader(TOPIC, wal, metadata, objects, broker_id=1, fencing=fence,
                  config=UploaderConfig(compression="none"), committed_through=None,
                  metrics=UploaderMetrics(CollectorRegistry()))
    tip = wal.next_offset - 1
    assert up.drain(30) == tip
    descriptors = list_descriptors(metadata, TOPIC)
    for d in descriptors:
        key = object_key(TOPIC, d.start_offset, d.object_id)
        assert object_frames(objects.get(key), key, TOPIC) == expected_frames(d.start_offset, d.end_offset), key
    orphans_before = len(find_orphans(metadata, objects, TOPIC))
    collect_garbage(metadata, objects, TOPIC, grace_s=0)
    assert find_orphans(metadata, objects, TOPIC) == []
    wal.close()
    metadata.close()
    objects.close()
    return {"tip": tip, "descriptors": len(descriptors), "orphans_collected": orphans_before}


def put_owner(root: str) -> None:
    from tiered.metadata import keys

    metadata, objects = open_stores(root)
    owner, _ = fencing()
    metadata.put(keys.owner_key(TOPIC), owner.to_json())
    metadata.close()
    objects.close()


def verify_and_print(root: str, kills: int) -> None:
    result = verify(root)
    result["kills"] = kills
    print(json.dumps(result))


def main(root: str, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    if remote():
        prepare_remote()
    forked(put_owner, root)
    kills = 0
    for _ in range(rounds):
        kill_at = rng.randint(1, 12)
        child_seed = rng.randrange(1 << 30)
        pid = os.fork()
        if pid == 0:
            try:
                child(root, random.Random(child_seed), kill_at)
            except BaseException:
                import traceback

                traceback.print_exc()
            os._exit(3)  # an exception in the child: reported as a bad exit
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            kills += 1
        elif os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"child failed with status {status}")
        forked(check_chain, root)
    forked(verify_and_print, root, kills)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
