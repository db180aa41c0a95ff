"""SIGKILL a writer process at random moments (>= 200 kills); nothing reported durable is lost."""
from __future__ import annotations

import os
import random
import threading

from tests.wal.crash_driver import CrashRun, Zygote, verify

KILLS_PER_WORKER = 110
WORKERS = 2  # one per core: each drives its own fork server and WAL directory


def test_sigkill_rounds_lose_nothing_reported_durable_and_never_reuse_offsets(tmp_path):
    runs = [CrashRun(os.path.join(tmp_path, f"w{i}")) for i in range(WORKERS)]
    errors: list = []

    def work(run: CrashRun, seed: int) -> None:
        zygote = Zygote()
        rng = random.Random(seed)
        try:
            for _ in range(KILLS_PER_WORKER):
                zygote.run_round(run, rng)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            zygote.close()

    threads = [threading.Thread(target=work, args=(run, i)) for i, run in enumerate(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    if errors:
        raise errors[0]
    assert sum(run.kills for run in runs) >= 200
    for run in runs:
        assert run.durable_max() > 100, "the writers should have made real progress"
        assert verify(run) > run.durable_max()
