"""Importing any module of the packages registers no metric: registries are passed in by
their owners (docs: tiered/metrics.py), never filled at import time."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_importing_every_module_adds_nothing_to_the_process_registry() -> None:
    script = textwrap.dedent("""
        import json
        from prometheus_client import REGISTRY

        def names():
            return sorted(REGISTRY._names_to_collectors)

        before = names()
        from tests.test_errors import project_modules
        modules = project_modules()
        print(json.dumps({"modules": len(modules), "added": sorted(set(names()) - set(before))}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["modules"] > 50
    assert result["added"] == []
