"""`dnb --config FILE`, `--set`, `dnb config show`, and a broker process started from a
config file (with an env override on top)."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from tests.cli.helpers import REPO, dnb
from tests.fixtures.servers import free_port

HANG_GUARD_S = 60.0


def _keys(run) -> dict[str, dict]:
    assert run.rc == 0, run.err
    return {row["key"]: row for row in run.json()["keys"]}


def test_config_show_says_where_each_value_came_from(tmp_path, monkeypatch):
    path = tmp_path / "dnb.toml"
    path.write_text(f'data_dir = "{tmp_path}/from-file"\nbroker_id = "f"\n[wal]\nsegment_age_max_s = 60\n'
                    '[uploader]\nzstd_level = 4\n')
    monkeypatch.setenv("DNB_BROKER_ID", "e")
    monkeypatch.setenv("DNB_UPLOADER_ZSTD_LEVEL", "5")
    rows = _keys(dnb("--json", "--config", str(path), "--broker-id", "x", "--set", "uploader.zstd_level=6",
                     "config", "show"))
    assert rows["broker_id"] == {"key": "broker_id", "value": "x", "source": "flag --broker-id"}
    assert rows["uploader.zstd_level"]["value"] == 6
    assert rows["uploader.zstd_level"]["source"] == "flag --set uploader.zstd_level"
    assert rows["wal.segment_age_max_s"] == {"key": "wal.segment_age_max_s", "value": 60.0, "source": f"file {path}"}
    assert rows["data_dir"]["value"] == f"{tmp_path}/from-file"
    assert rows["wal_dir"]["value"] == f"{tmp_path}/from-file/wal"
    assert rows["wal_dir"]["source"] == "default (from data_dir)"
    assert rows["wal.segment_bytes_max"] == {"key": "wal.segment_bytes_max", "value": 128 << 20, "source": "default"}
    # without --json: a table with the same three columns; without the flags, env wins
    text = dnb("--config", str(path), "config", "show")
    assert text.rc == 0 and f"file {path}" in text.out
    assert "env DNB_UPLOADER_ZSTD_LEVEL" in text.out and "env DNB_BROKER_ID" in text.out


def test_env_beats_the_file_in_the_cli(tmp_path, monkeypatch):
    path = tmp_path / "dnb.toml"
    path.write_text("[uploader]\nzstd_level = 4\n")
    monkeypatch.setenv("DNB_CONFIG", str(path))
    monkeypatch.setenv("DNB_UPLOADER_ZSTD_LEVEL", "5")
    rows = _keys(dnb("--json", "config", "show"))
    assert rows["uploader.zstd_level"] == {"key": "uploader.zstd_level", "value": 5,
                                           "source": "env DNB_UPLOADER_ZSTD_LEVEL"}


def test_config_show_hides_url_credentials(tmp_path):
    rows = _keys(dnb("--json", "--metadata", "etcd://user:secret@127.0.0.1:2379", "config", "show"))
    assert rows["metadata"]["value"] == "etcd://***@127.0.0.1:2379"


def test_bad_config_exits_2_naming_key_and_source(tmp_path):
    path = tmp_path / "dnb.toml"
    path.write_text("[wal]\nsegment_age_max_ms = 3\n")
    run = dnb("--config", str(path), "config", "show")
    assert run.rc == 2 and "wal.segment_age_max_ms" in run.err and str(path) in run.err
    assert "did you mean wal.segment_age_max_s" in run.err and "Traceback" not in run.err
    run = dnb("--json", "--set", "wal.append_timeout_s=fast", "config", "show")
    assert run.rc == 2
    error = run.json()["error"]
    assert error["type"] == "ConfigError" and "--set wal.append_timeout_s" in error["message"]
    run = dnb("--set", "nonsense", "config", "show")
    assert run.rc == 2 and "KEY=VALUE" in run.err


def test_a_store_url_from_the_file_is_checked_and_named(tmp_path):
    path = tmp_path / "dnb.toml"
    path.write_text('metadata = "mysql://x/y"\n')
    run = dnb("--config", str(path), "config", "show")
    assert run.rc == 2 and "unknown scheme 'mysql'" in run.err and f"metadata (from file {path})" in run.err


def test_one_shot_commands_use_the_file(tmp_path):
    path = tmp_path / "dnb.toml"
    path.write_text(f'data_dir = "{tmp_path}/d"\nwal_dir = "{tmp_path}/w"\nbroker_id = "cfg"\n'
                    f'[wal]\nmax_message_bytes = 1000\npending_bytes_max = 100000\n')
    run = dnb("--json", "--config", str(path), "produce", "/default/t", "--count", "3", "--size", "500")
    assert run.rc == 0, run.err
    assert run.json()["last_offset"] == 2
    assert os.path.isdir(tmp_path / "w" / "default" / "t") and os.path.exists(tmp_path / "d" / "metadata.db")
    run = dnb("--config", str(path), "produce", "/default/t", "--count", "1", "--size", "2000")
    assert run.rc != 0 and "large" in run.err.lower(), run.err  # the file's 1000-byte limit applies
    run = dnb("--config", str(path), "--set", "wal.max_message_bytes=4000", "produce", "/default/t",
              "--count", "1", "--size", "2000")
    assert run.rc == 0, run.err


def test_a_broker_started_from_a_config_file(tmp_path):
    file_port, env_port = free_port(), free_port()
    os.makedirs(tmp_path / "objects")
    path = tmp_path / "dnb.toml"
    path.write_text(f"""
broker_id = "from-file"
data_dir = "{tmp_path}/data"
metadata = "sqlite:///{tmp_path}/shared.db"
objects = "file://{tmp_path}/objects"

[broker]
advertised_address = "http://broker.example:9999"

[server]
listen_host = "127.0.0.1"
listen_port = {file_port}
shutdown_timeout_s = 30.0
""".replace("sqlite:////", "sqlite:///"))
    env = {**os.environ, "PYTHONPATH": REPO, "GRPC_VERBOSITY": "ERROR",
           "DNB_SERVER_LISTEN_PORT": str(env_port)}  # env beats the file
    proc = subprocess.Popen([sys.executable, "-m", "tiered.tools.cli.main", "--config", str(path), "broker", "run"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{env_port}/healthz", timeout=2) as r:
                    health = json.load(r)
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "hang guard: broker did not start"
            time.sleep(0.05)
        assert health["broker_id"] == "from-file"
        assert os.path.isdir(tmp_path / "data" / "wal")

        from tiered.lifecycle.ownership import registered_key
        from tiered.metadata import open_metadata

        metadata = open_metadata(f"sqlite:///{tmp_path}/shared.db".replace("sqlite:////", "sqlite:///"))
        try:
            registration = json.loads(metadata.get(registered_key("from-file")).value)
        finally:
            metadata.close()
        assert registration["address"] == "http://broker.example:9999"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANG_GUARD_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
