"""etcd with TLS (server cert + client-cert auth) and with user/password auth, on real
servers: the backend's TLS and auth pass-through works, refusals are typed and quick,
and no credential, token or key material leaks into errors, logs, ``repr`` or the CLI.

Decisions proved here (see docs/STORES.md):
* A refused TLS handshake (server cert not trusted, client cert missing) is
  ``PermissionDenied``: a configuration problem that retrying cannot fix. A plaintext
  client talking to a TLS server, or a TLS client to a plaintext one, stays
  ``StorageUnavailable`` with a hint (gRPC reports a bare "Socket closed" / "Handshake
  read failed", the same words as a connection dropped by a dying server).
* Wrong or missing user/password is ``PermissionDenied``.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import urllib.parse

import pytest

from tests.fixtures.servers import EtcdServer, TestPki
from tiered.errors import PermissionDenied, StorageUnavailable
from tiered.metadata import Put, PutEvent, absent, open_metadata

pytestmark = pytest.mark.etcd

CALL_BOUND_S = 2.0  # a refused call answers within this (measured: a few ms)
ROOT_PASSWORD = "s3cr3t:p@ss/w%rd-Zq7"  # needs percent-encoding in a URL
PW_URL = urllib.parse.quote(ROOT_PASSWORD, safe="")


def _timed(fn):
    started = time.monotonic()
    try:
        return fn(), None, time.monotonic() - started
    except Exception as e:  # noqa: BLE001 - the caller asserts on the type
        return None, e, time.monotonic() - started


def _chain_text(error: BaseException) -> str:
    """str and repr of an error and everything it was raised from."""
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts += [str(error), repr(error)]
        error = error.__cause__ or error.__context__
    return "\n".join(parts)


def _exercise(store) -> None:
    """put/get/range/txn (one winner)/lease/watch on one store."""
    assert store.put("/k/a", b"1") > 0
    assert store.get("/k/a").value == b"1"
    won = [store.txn([absent("/k/once")], [Put("/k/once", str(i).encode())]).succeeded for i in range(3)]
    assert won == [True, False, False]
    assert [kv.key for kv in store.range("/k/")] == ["/k/a", "/k/once"]
    lease = store.grant_lease(5)
    store.put("/k/leased", b"x", lease_id=lease.id)
    store.refresh_lease(lease.id)
    store.revoke_lease(lease.id)
    assert store.get("/k/leased") is None
    watch = store.watch_prefix("/w/")
    try:
        store.put("/w/1", b"hello")
        event = watch.get(timeout_s=5)
        assert isinstance(event, PutEvent) and event.kv.key == "/w/1" and event.kv.value == b"hello"
    finally:
        watch.cancel()


# -- TLS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> TestPki:
    return TestPki.create(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture(scope="module")
def tls_etcd(pki):
    server = EtcdServer(tls=pki).start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def key_material(pki) -> list[str]:
    """Lines of every PEM file: none may show up in an error."""
    lines = []
    for path in (pki.client_key, pki.client_cert, pki.ca_cert, pki.other_ca_cert, pki.server_key):
        with open(path) as f:
            lines += [line for line in f.read().splitlines() if line and not line.startswith("-----")]
    return lines + ["-----BEGIN"]


def _assert_no_key_material(error: BaseException, key_material: list[str]) -> None:
    text = _chain_text(error)
    leaked = [line for line in key_material if line in text]
    assert not leaked, f"key material in error: {leaked[:2]}"


def test_tls_with_client_cert_does_put_get_txn_lease_watch(tls_etcd):
    store = open_metadata(f"etcd://127.0.0.1:{tls_etcd.client_port}/tls{tls_etcd.tls_query()}", timeout_s=3)
    try:
        _exercise(store)
    finally:
        store.close()


@pytest.mark.parametrize(
    "case, problem",
    [("no client cert", "client certificate"), ("wrong CA", "not trusted")],
)
def test_tls_refusal_is_permission_denied_quickly_without_key_material(tls_etcd, pki, key_material, case, problem):
    query = (tls_etcd.tls_query(client_cert=False) if case == "no client cert"
             else tls_etcd.tls_query(ca_cert=pki.other_ca_cert))
    store = open_metadata(f"etcd://127.0.0.1:{tls_etcd.client_port}{query}", timeout_s=3)
    try:
        for call in (lambda: store.get("/x"), lambda: store.put("/x", b"v"), lambda: store.watch_prefix("/x/")):
            _, err, took = _timed(call)
            assert isinstance(err, PermissionDenied), (case, repr(err))
            assert not isinstance(err, StorageUnavailable) and not err.retryable
            assert took < CALL_BOUND_S, (case, took)
            assert problem in str(err) and f"127.0.0.1:{tls_etcd.client_port}" in str(err)
            _assert_no_key_material(err, key_material)
    finally:
        store.close()


def test_plaintext_client_to_tls_server_is_unavailable_quickly_with_a_hint(tls_etcd):
    # gRPC reports only "Socket closed": indistinguishable from a dropped connection, so
    # it stays retryable; the message says what to check.
    store = open_metadata(f"etcd://127.0.0.1:{tls_etcd.client_port}", timeout_s=3)
    try:
        _, err, took = _timed(lambda: store.get("/x"))
        assert isinstance(err, StorageUnavailable) and took < CALL_BOUND_S, (repr(err), took)
        assert "ca_cert" in str(err)
    finally:
        store.close()


def test_tls_client_to_plaintext_server_is_unavailable_quickly_with_a_hint(etcd_server, pki, key_material):
    # "Handshake read failed (Socket closed)": the same words as a server dying
    # mid-handshake, so it stays retryable too.
    query = f"?ca_cert={pki.ca_cert}&cert_cert={pki.client_cert}&cert_key={pki.client_key}"
    store = open_metadata(f"{etcd_server.url}{query}", timeout_s=3)
    try:
        _, err, took = _timed(lambda: store.get("/x"))
        assert isinstance(err, StorageUnavailable) and took < CALL_BOUND_S, (repr(err), took)
        assert "TLS" in str(err)
        _assert_no_key_material(err, key_material)
    finally:
        store.close()


def test_bad_tls_files_are_value_errors_naming_the_option_not_the_contents(tls_etcd, pki, tmp_path):
    secret = "PRIVATE-LOOKING-CONTENT-9f3b1c"
    junk = tmp_path / "junk.pem"
    junk.write_text(f"{secret}\n")
    base = f"etcd://127.0.0.1:{tls_etcd.client_port}"
    cases = {
        "cert_key": f"?ca_cert={pki.ca_cert}&cert_cert={pki.client_cert}&cert_key={junk}",
        "ca_cert": f"?ca_cert={junk}",
        "cert_cert": f"?ca_cert={pki.ca_cert}&cert_cert={tmp_path / 'missing.crt'}&cert_key={pki.client_key}",
    }
    for option, query in cases.items():
        with pytest.raises(ValueError) as info:
            open_metadata(base + query)
        assert option in str(info.value) and secret not in _chain_text(info.value), str(info.value)
    # A client cert without its key (or the reverse) is refused, not silently dropped.
    with pytest.raises(ValueError, match="cert_cert and cert_key"):
        open_metadata(f"{base}?ca_cert={pki.ca_cert}&cert_cert={pki.client_cert}")


def test_client_cert_without_ca_cert_still_uses_tls(tls_etcd, pki):
    # Before: cert_cert/cert_key without ca_cert were ignored and the store spoke plaintext.
    # Now TLS is on (system trust store), so our private CA is not trusted: PermissionDenied.
    store = open_metadata(f"etcd://127.0.0.1:{tls_etcd.client_port}?cert_cert={pki.client_cert}&cert_key={pki.client_key}")
    try:
        with pytest.raises(PermissionDenied, match="not trusted"):
            store.get("/x")
    finally:
        store.close()


# -- user/password ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_etcd():
    server = EtcdServer().start()
    server.enable_auth(ROOT_PASSWORD)
    yield server
    server.cleanup()


def _auth_url(server: EtcdServer, password_in_url: str = PW_URL, root: str = "/auth") -> str:
    return f"etcd://root:{password_in_url}@127.0.0.1:{server.client_port}{root}"


def test_auth_root_with_percent_encoded_password_works(auth_etcd, caplog):
    caplog.set_level(logging.DEBUG)
    store = open_metadata(_auth_url(auth_etcd), timeout_s=3)
    try:
        _exercise(store)
        for text in (repr(store), str(store), repr(vars(store)), caplog.text):
            assert ROOT_PASSWORD not in text and PW_URL not in text
    finally:
        store.close()


@pytest.mark.parametrize("url_kind", ["wrong password", "no credentials", "unknown user"])
def test_auth_refusal_is_permission_denied_quickly_and_never_shows_the_password(auth_etcd, caplog, url_kind):
    caplog.set_level(logging.DEBUG)
    wrong = "WRONG-pw-4471"
    url = {
        "wrong password": _auth_url(auth_etcd, wrong),
        "no credentials": f"etcd://127.0.0.1:{auth_etcd.client_port}/auth",
        "unknown user": f"etcd://nobody:{wrong}@127.0.0.1:{auth_etcd.client_port}/auth",
    }[url_kind]
    store = open_metadata(url, timeout_s=3)
    try:
        for call in (lambda: store.get("/x"), lambda: store.put("/x", b"v"), lambda: store.watch_prefix("/x/")):
            _, err, took = _timed(call)
            assert isinstance(err, PermissionDenied) and not err.retryable, (url_kind, repr(err))
            assert took < CALL_BOUND_S, (url_kind, took)
            text = _chain_text(err) + repr(store) + caplog.text
            assert wrong not in text and ROOT_PASSWORD not in text
    finally:
        store.close()


def test_auth_token_lost_on_server_restart_is_renewed_transparently(auth_etcd):
    """etcd's simple tokens live in the server's memory: after a restart every token is
    invalid ("invalid auth token"). The store authenticates again by itself (the same
    happens after --auth-token-ttl idle seconds, or on failover to another member)."""
    store = open_metadata(_auth_url(auth_etcd, root="/restart"), timeout_s=3)
    try:
        store.put("/k", b"before")
        auth_etcd.stop()
        auth_etcd.start()
        deadline = time.monotonic() + 5
        while True:  # the channel may need a moment to reconnect; auth must not be the problem
            _, err, _ = _timed(lambda: store.get("/k"))
            if err is None or time.monotonic() > deadline:
                break
            assert isinstance(err, StorageUnavailable), repr(err)
            time.sleep(0.05)
        assert err is None, repr(err)
        assert store.get("/k").value == b"before"
        store.put("/k", b"after")
        watch = store.watch_prefix("/w/")  # a watch after re-authentication sees events
        try:
            store.put("/w/1", b"x")
            assert watch.get(timeout_s=5).kv.key == "/w/1"
        finally:
            watch.cancel()
    finally:
        store.close()


def test_user_without_password_is_refused_before_any_call(auth_etcd):
    with pytest.raises(ValueError, match="user name and a non-empty password"):
        open_metadata(f"etcd://root@127.0.0.1:{auth_etcd.client_port}")


def test_cli_with_wrong_password_fails_without_showing_it(auth_etcd, tmp_path):
    wrong = "WRONG-cli-pw-8812"
    env = dict(os.environ, GRPC_VERBOSITY="ERROR")
    env.pop("DNB_METADATA", None)
    for extra in ([], ["--debug"]):
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "tiered.tools.cli.main", "--data-dir", str(tmp_path), *extra,
             "--metadata", _auth_url(auth_etcd, wrong), "inspect", "/a/b"],
            capture_output=True, text=True, timeout=60, env=env, cwd=os.getcwd(),
        )  # fmt: skip
        output = proc.stdout + proc.stderr
        assert proc.returncode != 0, output
        assert "permission denied" in output.lower() or "authentication failed" in output, output
        assert wrong not in output and ROOT_PASSWORD not in output, output
        assert time.monotonic() - started < 30
