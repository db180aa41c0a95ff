"""A side channel that counts what a read touched, for tests and ``dnb query`` reports.

Spark's Python data sources have no accumulators, so when the ``metricsDir`` option is
set the planner and every task each write one small JSON file into that directory
(write-then-rename, unique names: no coordination, no partial files). :func:`collect`
sums them. Counts, not timings, so tests can assert on them.
"""
from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class PlanReport:
    topic: str
    objects_total: int = 0
    objects_planned: int = 0
    blocks_total: int = 0
    blocks_planned: int = 0
    partitions: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def write(directory: str | None, kind: str, record: dict[str, Any]) -> None:
    """Drop one ``<kind>-<uuid>.json`` into ``directory`` (no-op without one)."""
    if not directory:
        return
    os.makedirs(directory, exist_ok=True)
    name = f"{kind}-{uuid.uuid4().hex}.json"
    tmp = os.path.join(directory, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(directory, name))


def collect(directory: str) -> dict[str, Any]:
    """Totals over every file in ``directory``.

    ``objects_read`` counts distinct objects any task fetched bytes from; ``blocks_read``
    and ``bytes_read`` are summed over tasks; ``plans`` lists planner reports (Spark may
    plan a query more than once) and ``skipped`` every skipped object or block.
    """
    keys: set[str] = set()
    totals: dict[str, Any] = {"objects_read": 0, "blocks_read": 0, "bytes_read": 0, "rows": 0,
                              "tasks": 0, "plans": [], "skipped": []}
    if not os.path.isdir(directory):
        return totals
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        with open(os.path.join(directory, name)) as f:
            record = json.load(f)
        kind = name.split("-", 1)[0]
        if kind == "read":
            totals["tasks"] += 1
            keys.update(record["keys"])
            for k in ("blocks_read", "bytes_read", "rows"):
                totals[k] += record[k]
        elif kind == "plan":
            totals["plans"].append(record)
        elif kind == "skipped":
            totals["skipped"].append(record)
    totals["objects_read"] = len(keys)
    return totals
