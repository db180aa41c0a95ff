"""Run ``dnb`` in-process (``main(argv)``) or as a real subprocess, capturing output."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUBPROCESS_TIMEOUT_S = 120


@dataclass
class Run:
    rc: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        lines = [line for line in self.out.splitlines() if line.strip()]
        assert len(lines) == 1, f"expected exactly one JSON line, got {self.out!r}"
        value = json.loads(lines[0])
        assert isinstance(value, dict)
        return value


def dnb(*argv: str, stdin: str | None = None) -> Run:
    """``main(argv)`` in this process."""
    from tiered.tools.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin or "")
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = main(list(argv))
    finally:
        sys.stdin = old_stdin
    return Run(rc, out.getvalue(), err.getvalue())


def dnb_process(*argv: str, stdin: str | None = None, env: dict[str, str] | None = None) -> Run:
    """``dnb`` as its own process: the installed script when present, else ``-m``."""
    script = os.path.join(os.path.dirname(sys.executable), "dnb")
    cmd = [script] if os.path.exists(script) and shutil.which(script) else [sys.executable, "-m", "tiered.tools.cli.main"]
    full_env = {**os.environ, "PYTHONPATH": REPO, "GRPC_VERBOSITY": "ERROR", **(env or {})}
    proc = subprocess.run([*cmd, *argv], input=stdin or "", capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, env=full_env, cwd=REPO)
    return Run(proc.returncode, proc.stdout, proc.stderr)


def stores(tmp_path: Any) -> list[str]:
    """Global options for a shared metadata/object store under ``tmp_path``."""
    return ["--metadata", f"sqlite:///{tmp_path}/shared.db".replace("////", "///"),
            "--objects", f"file://{tmp_path}/objects"]


def broker(tmp_path: Any, broker_id: str) -> list[str]:
    return ["--data-dir", str(tmp_path / f"broker-{broker_id}"), *stores(tmp_path), "--broker-id", broker_id]
