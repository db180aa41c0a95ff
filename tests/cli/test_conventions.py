"""Command-line conventions: global options before or after the command, --version,
exit codes in --help, every failure as one JSON error object with a stable code under
--json, exit codes of Spark SQL and missing-object errors, quiet logs unless -v, progress
bars only at a terminal, and a --help that does not import the library."""
from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest

from tests.cli.helpers import REPO, broker, dnb

TOPIC = "/default/reliable_topic"


def test_global_options_are_accepted_after_the_command(tmp_path):
    a = broker(tmp_path, "1")
    assert dnb("produce", TOPIC, "--count", "2", *a, "--json").json() == {"first_offset": 0, "last_offset": 1}
    # split: some before, some after; the later --broker-id wins like any repeated option
    info = dnb("--data-dir", str(tmp_path / "broker-1"), "inspect", TOPIC, *a[2:], "--json").json()
    assert info["owner"] == "1" and info["local_wal"] == {"first_offset": 0, "last_offset": 1}
    assert dnb(*a, "inspect", TOPIC, "--broker-id", "9", "--json").json()["owner"] == "1"
    # global options on the sub-command of a group too
    rows = dnb("config", "show", "--json", "--set", "uploader.zstd_level=7").json()["keys"]
    assert {r["key"]: r["value"] for r in rows}["uploader.zstd_level"] == 7


def test_version_and_help_document_exit_codes():
    from importlib.metadata import version

    run = dnb("--version")
    assert run.rc == 0 and run.out.strip() == f"dnb {version('dnb-storage')}"
    run = dnb("--help")
    assert run.rc == 0 and "Exit codes:" in run.out
    for line in ("0    ok", "2    usage", "3    refused", "4    unavailable", "5    data", "70   internal"):
        assert line in run.out, line
    for command in ("produce", "consume", "seal", "verify", "cluster", "config"):
        assert command in run.out
    assert "inspect" in dnb("inspect", "--help").out and dnb("inspect", "--help").rc == 0
    assert "drain" in dnb("cluster", "--help").out


@pytest.mark.parametrize("argv", [
    ("inspect",),                                  # missing TOPIC
    ("inspect", "no-slash"),                       # bad TOPIC
    ("nosuch",),                                   # unknown command
    ("produce", TOPIC, "--count", "x"),            # bad value
    ("produce", TOPIC, "--bogus"),                 # unknown option
    (),                                            # no command at all
])
def test_usage_errors_are_json_error_objects_with_a_stable_code(tmp_path, argv):
    run = dnb("--data-dir", str(tmp_path / "d"), *argv, "--json")
    assert run.rc == 2
    error = run.json()["error"]
    assert error["code"] == "usage" and error["exit_code"] == 2 and error["message"]
    assert run.err.startswith("dnb: ") and "Traceback" not in run.err
    assert not os.path.exists(tmp_path / "d")
    plain = dnb("--data-dir", str(tmp_path / "d"), *argv)
    assert plain.rc == 2 and plain.out == "" and plain.err.startswith("dnb: ")


def test_library_errors_carry_the_code_too(tmp_path):
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "1")
    run = dnb(*broker(tmp_path, "2"), "seal", TOPIC, "--json")
    assert run.rc == 3 and run.json()["error"]["code"] == "refused"


def test_a_missing_archive_object_is_a_data_error(tmp_path):
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "5", "--ack", "archived")
    assert dnb(*a, "seal", TOPIC).rc == 0
    [path] = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "objects") for f in fs if f.endswith(".dnb1")]
    os.remove(path)
    run = dnb(*broker(tmp_path, "2"), "consume", TOPIC, "--subscription", "s", "--json")
    assert run.rc == 5, run.err
    assert run.json()["error"]["code"] == "data" and "Traceback" not in run.err


def _spark_error(name: str) -> type[Exception]:
    """A stand-in for a pyspark error class (matched by module and class name)."""
    return type(name, (Exception,), {"__module__": "pyspark.errors.exceptions.captured"})


@pytest.mark.parametrize("name, rc, code", [("ParseException", 2, "usage"), ("AnalysisException", 2, "usage"),
                                            ("Py4JJavaError", 70, "internal")])
def test_spark_sql_typos_are_usage_errors(tmp_path, monkeypatch, name, rc, code):
    import tiered.spark.query as spark_query

    def fail(*_args, **_kw):
        raise _spark_error(name)("[PARSE_SYNTAX_ERROR] Syntax error at or near 'SELEC'")

    monkeypatch.setattr(spark_query, "run_query", fail)
    run = dnb(*broker(tmp_path, "1"), "query", TOPIC, "SELEC 1", "--json")
    assert run.rc == rc and run.json()["error"]["code"] == code
    assert "query failed" in run.err and "SELEC" in run.err


def test_library_warnings_stay_off_stderr_unless_verbose(tmp_path, monkeypatch):
    from tiered.tools.cli import ops

    real = ops.inspect

    def noisy(*args, **kwargs):
        for _ in range(50):
            logging.getLogger("tiered.metadata.etcd").warning("etcd unavailable: retrying")
        logging.getLogger("tiered.lifecycle").info("topic %s: available again", TOPIC)
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "inspect", noisy)
    dnb(*broker(tmp_path, "1"), "produce", TOPIC, "--count", "1")  # inspect of an unknown topic exits 7
    # A library logger with its own level (as `dnb broker run` sets "tiered" to INFO in
    # its process) does not get past the CLI's level either.
    tiered_log = logging.getLogger("tiered")
    old_level = tiered_log.level
    tiered_log.setLevel(logging.INFO)
    try:
        quiet = dnb(*broker(tmp_path, "1"), "inspect", TOPIC)
    finally:
        tiered_log.setLevel(old_level)
    assert quiet.rc == 0 and "retrying" not in quiet.err and "available again" not in quiet.err
    verbose = dnb(*broker(tmp_path, "1"), "inspect", TOPIC, "-v")
    assert verbose.rc == 0 and "available again" in verbose.err
    assert verbose.err.count("etcd unavailable: retrying") == 3  # repeats are cut


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_only_at_a_terminal():
    from tiered.tools.cli.output import Output

    tty = Output(stdout=_Terminal(), stderr=_Terminal())
    assert list(tty.progress(range(5), 5, "verifying objects")) == list(range(5))
    assert "verifying objects" in tty.stderr.getvalue() and "5/5" in tty.stderr.getvalue()
    with tty.tracker("sealing /a/b", 10) as advance:
        advance(10)
    assert "sealing /a/b" in tty.stderr.getvalue()
    for out in (Output(json_mode=True, stdout=_Terminal(), stderr=_Terminal()),   # --json
                Output(stdout=io.StringIO(), stderr=_Terminal()),                   # stdout piped
                Output(stdout=_Terminal(), stderr=io.StringIO())):                  # stderr redirected
        assert list(out.progress(range(3), 3, "x")) == [0, 1, 2]
        with out.tracker("y", 3) as advance:
            advance(3)
        assert out.stderr.getvalue() == ""


def test_tables_keep_markup_as_text():
    from tiered.tools.cli.output import render_mapping, render_table

    text = render_table(("offset", "payload"), [(0, "[red]not a style[/red]"), (1, None)])
    assert text.splitlines() == ["offset  payload", "-" * 30,
                                 "0       [red]not a style[/red]", "1       -"]
    assert render_mapping({"first_offset": 0, "last_offset": 5}).splitlines() == \
        ["first_offset  0", "last_offset   5"]


def test_help_does_not_import_the_library():
    code = ("import sys; from tiered.tools.cli.main import main; rc = main(['--help']); "
            "heavy = [m for m in ('tiered.lifecycle', 'tiered.read', 'uploader', 'boto3', 'rich', 'tiered.cluster')"
            " if m in sys.modules]; print(rc, heavy, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO}, timeout=60)
    assert proc.stderr.strip().splitlines()[-1] == "0 []", proc.stderr


def test_repeated_log_lines_are_rate_limited_not_silenced_for_good():
    from tiered.tools.cli.main import _RepeatFilter

    def record(text, created):
        r = logging.LogRecord("tiered.x", logging.WARNING, __file__, 1, text, (), None)
        r.created = created
        return r

    f = _RepeatFilter(limit=2, window_s=60.0)
    assert [f.filter(record("down", t)) for t in (0, 1, 2, 3)] == [True, True, False, False]
    assert f.filter(record("other", 4))           # another line has its own budget
    assert f.filter(record("down", 61))           # a new minute: shown again
