"""A hosted topic costs no thread of its own: its WAL commits on the WAL root's one
commit-group writer, uploads run on the host's bounded pool, cursor flushes on its one
scheduler, progress on its one progress thread."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from tests.tiered.helpers_lifecycle import FAST_BROKER, Cluster, local_cluster, wal_files  # noqa: F401
from tiered.lifecycle import UnloadError
from tiered.lifecycle.hosted import TopicState

#: Threads a BrokerHost starts, whatever its topic count: the session keep-alive, the
#: progress thread, the cursor scheduler, the reopen scheduler (failed WALs), the upload
#: pool's workers (``upload_workers_max``, 4 here) and its scheduler, and the commit-group
#: writer and the journal checkpointer of its one WAL root = 11.
HOST_THREADS_MAX = 11

TOPICS = 500
WAIT_S = 60.0


def _started_since(before: set[threading.Thread]) -> list[str]:
    """Threads alive now that were not before (other tests' leftover threads may end
    meanwhile: a process-wide count would move with them)."""
    return sorted(t.name for t in threading.enumerate() if t not in before)


def test_threads_do_not_grow_with_the_topic_count(local_cluster: Cluster) -> None:
    before = set(threading.enumerate())
    host = local_cluster.broker("A", upload_workers_max=4)
    after_start = _started_since(before)
    assert len(after_start) <= HOST_THREADS_MAX, after_start
    hosted = [host.load(f"/default/t{i:04d}") for i in range(TOPICS)]
    for h in hosted[::50]:  # subscriptions and produces start no thread either
        h.produce(b"x")
        h.subscribe("s").ack(0)
    assert _started_since(before) == after_start
    host.close(unload=False)


def test_cursor_flushes_of_many_topics_run_on_the_shared_scheduler(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A", cursor_flush_every_acks=1, cursor_flush_interval_s=3600.0)
    host_jobs = len(host.cursor_scheduler)  # the host's own (the heap's refreeze)
    subs = []
    for i in range(20):
        hosted = host.load(f"/default/c{i:02d}")
        hosted.produce(b"m")
        sub = hosted.subscribe("s", initial="earliest")
        sub.ack(0)  # due at once (every ack): the shared scheduler writes it
        subs.append(sub)
    assert len(host.cursor_scheduler) == host_jobs + 20
    done = threading.Event()
    check = host.cursor_scheduler.every(0.01, lambda: done.set() if all(s.flushed_cursor == 0 for s in subs) else None)
    assert done.wait(WAIT_S), [s.flushed_cursor for s in subs]
    check.cancel()
    host.unload("/default/c00")  # the seal cancels the topic's job
    assert len(host.cursor_scheduler) == host_jobs + 19


def test_a_host_uploads_on_its_pool_and_archived_acks_of_all_topics_complete(local_cluster: Cluster) -> None:
    host = local_cluster.broker("A", uploader=replace(FAST_BROKER.uploader, drain_timeout_s=10.0),
                                upload_workers_max=2)
    topics = [host.load(f"/default/u{i:02d}") for i in range(12)]
    assert len(host.uploader_pool) == 12
    for h in topics:
        assert h.produce(b"a", ack="archived", timeout_s=WAIT_S) == 0
    for h in topics[:3]:
        assert host.unload(h.topic) == 0
    assert len(host.uploader_pool) == 9


def test_the_wal_is_kept_when_a_background_upload_pass_does_not_end_in_time(local_cluster: Cluster,
                                                                             monkeypatch) -> None:
    """Seal cleanup deletes the WAL only once no background pass of the topic runs."""
    host = local_cluster.broker("A")
    hosted = host.load("/default/slow")
    hosted.produce(b"m")
    monkeypatch.setattr(hosted.uploader, "stop", lambda timeout_s=30.0: False)  # a pass still running
    with pytest.raises(UnloadError) as info:
        host.unload("/default/slow")
    assert info.value.step == "stop uploader"
    assert hosted.state is TopicState.SEALED
    assert [n for n in wal_files(local_cluster, "A", "/default/slow") if n.endswith(".seg")]
    monkeypatch.undo()
    assert host.unload("/default/slow") == 0  # resumes at the cleanup
    assert wal_files(local_cluster, "A", "/default/slow") == []
