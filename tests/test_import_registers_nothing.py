"""Importing any module of the packages registers no metric (registries are passed in by
their owners, see tiered/metrics.py) and changes nothing in the process environment."""
from __future__ import annotations

import json
import os
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



def test_importing_the_library_leaves_the_process_environment_alone() -> None:
    """A library must not change the embedding process's environment behind its back
    (the etcd backend used to set GRPC_VERBOSITY at import)."""
    script = textwrap.dedent("""
        import os
        before = dict(os.environ)
        import tiered.lifecycle, tiered.metadata.etcd, tiered.metadata.sqlite, tiered.objects.s3, uploader, wal
        changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
        assert not changed, changed
    """)
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
