"""SIGKILL mid-upload at random steps (>= 100 kills), restart, same invariants.

Each driver process forks one child per round (see crash_driver.py); two drivers run in
parallel on separate directories with different seeds.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROUNDS_PER_DRIVER = 75
SEEDS = (11, 29)
DRIVER_TIMEOUT_S = 120


def test_sigkill_at_random_points_leaves_no_gap_duplicate_or_orphan(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    procs = []
    for seed in SEEDS:
        work = tmp_path / f"seed-{seed}"
        work.mkdir()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.uploader.crash_driver", str(work), str(ROUNDS_PER_DRIVER), str(seed)],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=DRIVER_TIMEOUT_S)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["kills"] for r in results) >= 100, results
    assert all(r["descriptors"] > 0 for r in results)


REMOTE_ROUNDS = 20
REMOTE_TIMEOUT_S = 90


def test_sigkill_on_real_etcd_and_s3_over_http(tmp_path, etcd_server, etcd_root, moto_server, s3_bucket):
    """The same crash rounds with the stores on real servers: etcd and moto over HTTP.

    Fewer rounds (each costs more); every child opens fresh clients after the fork.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    stores = f"{etcd_server.url}{etcd_root} s3://{s3_bucket}/arch?endpoint={moto_server.endpoint_url}"
    env = dict(os.environ, PYTHONPATH=root, DNB_CRASH_STORES=stores)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.uploader.crash_driver", str(tmp_path), str(REMOTE_ROUNDS), "7"],
        cwd=root, env=env, capture_output=True, text=True, timeout=REMOTE_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["kills"] >= REMOTE_ROUNDS // 2, result
    assert result["descriptors"] > 0 and result["tip"] > 0, result
    # The archive really is on the servers, not in the local directory.
    assert not (tmp_path / "meta.db").exists() and not (tmp_path / "objects").exists()
