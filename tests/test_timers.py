"""tiered.timers.Scheduler: many periodic jobs on one thread."""
from __future__ import annotations

import gc
import threading
import weakref

from tiered.timers import Scheduler

WAIT_S = 30.0


def test_many_jobs_run_on_one_thread_and_a_wake_runs_a_job_early():
    before = set(threading.enumerate())  # other tests' threads may end meanwhile
    scheduler = Scheduler("test-timers")
    runs: dict[int, int] = {}
    ran = [threading.Event() for _ in range(200)]

    def job(i: int):
        def run() -> None:
            runs[i] = runs.get(i, 0) + 1
            ran[i].set()
        return run

    try:
        jobs = [scheduler.every(3600.0, job(i)) for i in range(200)]
        assert len(set(threading.enumerate()) - before) == 1
        assert len(scheduler) == 200
        jobs[17].wake()  # due in an hour, run now
        assert ran[17].wait(WAIT_S)
        assert runs == {17: 1}
        assert jobs[17].cancel(WAIT_S) and len(scheduler) == 199
    finally:
        assert scheduler.close(WAIT_S)


def test_cancel_waits_for_a_run_in_flight_and_the_job_never_runs_again():
    scheduler = Scheduler("test-timers")
    inside, release, cancelled = threading.Event(), threading.Event(), threading.Event()
    runs = []

    def slow() -> None:
        runs.append(1)
        inside.set()
        assert release.wait(WAIT_S)

    try:
        job = scheduler.every(3600.0, slow)
        job.wake()
        assert inside.wait(WAIT_S)
        threading.Thread(target=lambda: (job.cancel(WAIT_S), cancelled.set()), daemon=True).start()
        assert not cancelled.wait(0.2), "cancel() returned while the job was still running"
        job.wake()  # woken while running and cancelled: must not run again
        release.set()
        assert cancelled.wait(WAIT_S)
        other = threading.Event()
        scheduler.every(3600.0, other.set).wake()  # the thread still serves other jobs
        assert other.wait(WAIT_S)
        assert runs == [1]
    finally:
        release.set()
        assert scheduler.close(WAIT_S)


def test_a_failing_job_runs_again_and_does_not_stop_the_others():
    scheduler = Scheduler("test-timers")
    calls = []
    second = threading.Event()

    def failing() -> None:
        calls.append(1)
        if len(calls) >= 2:
            second.set()
        raise RuntimeError("store down")

    try:
        scheduler.every(0.01, failing)
        assert second.wait(WAIT_S)
        healthy = threading.Event()
        scheduler.every(3600.0, healthy.set).wake()
        assert healthy.wait(WAIT_S)
    finally:
        assert scheduler.close(WAIT_S)


def test_a_cancelled_job_does_not_keep_its_owner_alive_until_its_due_time():
    """A cancelled job's heap entry is dropped lazily, at its due time; until then it must
    not hold the owner (a cursor flush job of an unloaded topic would keep its WAL alive)."""
    class Owner:
        def flush(self) -> None:
            pass

    scheduler = Scheduler("test-owner")
    try:
        owner = Owner()
        job = scheduler.every(3600.0, owner.flush)
        gone = weakref.ref(owner)
        assert job.cancel()
        del owner
        gc.collect()
        assert gone() is None
    finally:
        scheduler.close()
