"""The load-manager simulator behind ``bench/bench_load_manager.py``.

``workloads.py`` (seeded topics and events) → ``world.py`` (ground truth, noisy reports,
moves, measurements) ← ``ours.py`` (the production decision core) and ``baselines.py``
(Danube and Pulsar); ``bound.py`` (LPT greedy and a lower bound); ``summary.py`` (one
row per run).
"""
