"""Spark over the dnb1 archive: the ``dnb1`` data source and ``dnb query``'s library side.

``pyspark`` and ``pyarrow`` are optional (extra ``spark``), so importing this package
without them raises an ImportError that says what to install.
"""
from __future__ import annotations

try:
    from tiered.spark.datasource import Dnb1DataSource
except ImportError as e:  # pragma: no cover - depends on the environment
    if e.name in ("pyspark", "pyarrow") or "pyspark" in str(e):
        raise ImportError("tiered.spark needs `pip install 'dnb-storage[spark]'` (pyspark, pyarrow)") from e
    raise

__all__ = ["Dnb1DataSource"]
