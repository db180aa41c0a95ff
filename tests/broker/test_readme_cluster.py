"""The README's "Running brokers" block, run as a new user would run it: the text of
the block itself, in bash, with ``dnb`` on the PATH, as subprocesses. Only the ports
(free ones), the directory (/tmp/dnb -> a temporary one) and, for the etcd + S3 run,
the store URLs are substituted; so the README cannot drift from what works."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid

import pytest

from tests.cli.helpers import REPO
from tests.fixtures.servers import free_port

RUN_TIMEOUT_S = 180
STORE_LINE = re.compile(r"^export DNB_METADATA=.*$", re.MULTILINE)


def readme_cluster_block() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    section = text[text.index("## Running brokers"):]
    match = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert match, "README: the Running brokers section lost its bash block"
    return match.group(1)


@pytest.mark.parametrize("backend", ["local", "etcd+s3"])
def test_the_readme_cluster_commands_work_as_written(tmp_path, request, backend) -> None:
    script = readme_cluster_block()
    assert len(STORE_LINE.findall(script)) == 1, script
    root = str(tmp_path / "dnb")
    for port in ("8081", "8082"):
        script = script.replace(f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}")
    script = script.replace("/tmp/dnb", root)
    if backend == "etcd+s3":
        etcd = request.getfixturevalue("etcd_server")
        moto = request.getfixturevalue("moto_server")
        bucket = request.getfixturevalue("s3_bucket")
        script = STORE_LINE.sub(
            f"export DNB_METADATA={etcd.url}/readme-{uuid.uuid4().hex[:8]} "
            f"DNB_OBJECTS='s3://{bucket}/dnb?endpoint={moto.endpoint_url}&region=us-east-1'", script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DNB_")}
    env.update(PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""), PYTHONPATH=REPO)
    # -e: stop at the first command that fails, as a reader would. Its own session, so
    # the brokers it starts in the background can be stopped if the run goes wrong.
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=str(tmp_path), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    logs = {b: open(os.path.join(root, f"{b}.log")).read() for b in ("b1", "b2")}
    assert proc.returncode == 0, (out, logs)
    # Step 2: offsets 0-2 on broker 1, produced and read through broker 2 (a redirect).
    assert re.search(r"first_offset\s+0\nlast_offset\s+2\n", out), out
    assert '"next": 3' in out and '"moved": false' in out, out
    # Step 3: broker 1 sealed at 2, broker 2 continued at 3; every offset read once.
    assert re.search(r"last_committed_offset\s+2\n", out), out
    assert re.search(r"first_offset\s+3\nlast_offset\s+5\n", out), out
    assert [int(o) for o in re.findall(r"^(\d+)\s+remote\s+message-\d+$", out, re.MULTILINE)] == list(range(6)), out
    assert "6 message(s)" in out, out
    # kill (SIGTERM): both brokers sealed what they hosted and said goodbye.
    for name, log in logs.items():
        assert "every topic sealed; deregistered; bye" in log, (name, log)
