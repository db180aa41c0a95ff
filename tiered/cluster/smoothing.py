"""Smoothing of load data: an exponential moving average per topic and per broker.

``smoothed = alpha·sample + (1 − alpha)·previous`` with ``alpha`` = 0.3 per report by
default: a sudden step reaches 83 % of its size after five reports, a single noisy report
moves the average by 30 % of its error.

Per-topic averages are keyed by topic, not by broker, so a topic's history follows it
when it moves (the new owner's first report continues the same average); the score
model attributes a broker's CPU and memory to its topics by their smoothed cost, so a
move shows in the scores at once instead of after the broker's own average catches up
(the trap of smoothing only broker totals: the balancer keeps shedding load that already
moved).

The runtime applies these as reports arrive and puts the result in the view; the
simulator does the same.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace

from tiered.cluster.view import LoadReport, TopicLoad

_TOPIC_FIELDS = tuple(f.name for f in fields(TopicLoad))
_REPORT_FIELDS = ("cpu_pct", "mem_pct", "net_in_bps", "net_out_bps", "disk_io_bps")


def ema(previous: float | None, sample: float, alpha: float) -> float:
    return sample if previous is None else alpha * sample + (1.0 - alpha) * previous


def smooth_topic_load(previous: TopicLoad | None, sample: TopicLoad, alpha: float) -> TopicLoad:
    if previous is None:
        return sample
    return TopicLoad(**{name: ema(getattr(previous, name), getattr(sample, name), alpha) for name in _TOPIC_FIELDS})


def smooth_report(previous: LoadReport | None, sample: LoadReport, alpha: float) -> LoadReport:
    """The sample's time, capacity and topic set with its resource numbers smoothed."""
    if previous is None:
        return sample
    return replace(sample, **{name: ema(getattr(previous, name), getattr(sample, name), alpha)
                              for name in _REPORT_FIELDS})


def smooth_topic_loads(previous: Mapping[str, TopicLoad], samples: Mapping[str, TopicLoad],
                       alpha: float) -> dict[str, TopicLoad]:
    """Fold one broker's per-topic samples into the cluster-wide averages. Topics the
    report does not mention keep their average (they may live on another broker)."""
    merged = dict(previous)
    for topic, sample in samples.items():
        merged[topic] = smooth_topic_load(previous.get(topic), sample, alpha)
    return merged
