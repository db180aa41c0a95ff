"""Metadata store on a real etcd cluster through ``pyetcd`` (etcd-sdk-python).

* Several endpoints with failover: a call that finds its endpoint unreachable moves
  to the next one at once (reads on any ``UNAVAILABLE``; writes only when no
  connection was made, so a write is never applied twice); an endpoint that failed is
  skipped for ``endpoint_retry_s``. When every endpoint is down the caller sees
  :class:`~tiered.errors.StorageUnavailable` (retryable) at once, and the first call
  after a server comes back succeeds (gRPC's reconnect back-off is capped at ~1 s).
* An optional ``root`` prefix is added to every key on the way in and stripped on
  the way out, so several clusters/tests can share one etcd.
* TLS: any of ``ca_cert``, ``cert_cert``, ``cert_key`` (PEM paths) turns TLS on; no
  ``ca_cert`` means the system trust store; a client cert needs its key. A refused
  handshake (server cert not trusted, client cert missing/rejected, unusable key) is
  :class:`~tiered.errors.PermissionDenied` (not retryable: retrying cannot fix a
  configuration), not ``StorageUnavailable``.
* ``user``/``password``: the store authenticates on first use and again whenever the
  server calls the token invalid (restart, ``--auth-token-ttl``, another member), and
  sends the token as plain gRPC metadata, so auth works over plaintext and TLS alike.
  Wrong credentials → :class:`~tiered.errors.PermissionDenied`.
* Credentials, tokens and key material never appear in errors, logs or ``repr``.
* Every RPC has a deadline (``timeout_s``).
* After ``fork()`` create a new store in the child; gRPC channels do not survive it.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# A library leaves the process environment alone: GRPC_VERBOSITY (grpc's C-core logging)
# is set by the programs that own their process (the dnb CLI and broker), not here.
import grpc
import pyetcd
from pyetcd import etcdrpc, exceptions as etcd_exc
from pyetcd import transactions as etcd_txn
from pyetcd.client import Endpoint

#: A pyetcd protobuf message or gRPC object: pyetcd and grpc ship no type information, so
#: these are unchecked (``Any``) and every value taken out of them is converted on the way.
_Pb = Any

from tiered.errors import (  # noqa: E402
    CompactedRevision,
    LeaseNotFound,
    MetadataError,
    OperationTimeout,
    PermissionDenied,
    StorageUnavailable,
)
from tiered.metadata.base import (  # noqa: E402
    Compare,
    Delete,
    DeleteEvent,
    Get,
    KeyValue,
    Lease,
    MetadataStore,
    Op,
    Put,
    PutEvent,
    ReadView,
    TxnResult,
    Watch,
    check_key,
    check_ops,
    prefix_end,
)

log = logging.getLogger(__name__)

_COMPARE_CLASSES = {
    "value": etcd_txn.Value,
    "version": etcd_txn.Version,
    "create_revision": etcd_txn.Create,
    "mod_revision": etcd_txn.Mod,
}


class EtcdMetadataStore(MetadataStore):
    """Metadata store on etcd v3. See the module docstring."""

    multi_process = True
    supports_compaction = True

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        root: str = "",
        timeout_s: float = 5.0,
        endpoint_retry_s: float = 1.0,
        ca_cert: str | None = None,
        cert_cert: str | None = None,
        cert_key: str | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        if root and (not root.startswith("/") or root.endswith("/")):
            raise ValueError(f"etcd root must look like /name (no trailing slash), got {root!r}")
        self.endpoints = list(endpoints)
        self.root = root
        self.timeout_s = timeout_s
        if (user is None) != (password is None) or user == "" or password == "":
            raise ValueError("etcd auth needs both a user name and a non-empty password")
        self._auth = _Credentials(user, password) if user is not None and password is not None else None
        self._authed = False  # a token is in self._client.metadata (or the server has no auth)
        creds = _tls_credentials(ca_cert, cert_cert, cert_key)
        with self._mapped("connect"):
            eps = [_endpoint(host, port, creds, endpoint_retry_s) for host, port in self.endpoints]
            # user/password are NOT given to pyetcd: it would authenticate once, in the
            # constructor, and send the token as call credentials, which gRPC refuses on a
            # plaintext channel. The store authenticates lazily and again whenever the
            # server says the token is invalid (simple tokens die with a restart, expire
            # after --auth-token-ttl idle seconds, and are local to one cluster member).
            self._client = pyetcd.MultiEndpointEtcd3Client(endpoints=eps, timeout=timeout_s, failover=True)

    # -- key mapping -------------------------------------------------------
    def _k(self, key: str) -> bytes:
        return (self.root + key).encode()

    def _unk(self, raw: bytes) -> str:
        return raw.decode()[len(self.root):]

    def _kv(self, kv: _Pb) -> KeyValue:
        return KeyValue(self._unk(kv.key), bytes(kv.value), kv.create_revision, kv.mod_revision, kv.version, kv.lease)

    # -- errors ------------------------------------------------------------
    @contextlib.contextmanager
    def _mapped(self, what: str) -> Iterator[None]:
        """Map gRPC / pyetcd errors onto the hierarchy; endpoints only, never credentials."""
        where = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        hint = ""
        try:
            try:
                yield
            except grpc.RpcError as e:
                tls_problem = _tls_problem(e)
                hint = _unavailable_hint(e)
                # Let pyetcd mark the endpoint failed (for failover), then map its error.
                if hasattr(self, "_client"):
                    try:
                        self._client._manage_grpc_errors(e)
                    except etcd_exc.Etcd3Exception:
                        if tls_problem is None:
                            raise
                if tls_problem is not None:
                    raise PermissionDenied(f"etcd {where}: {what}: {tls_problem}") from e
                raise
        except etcd_exc.ConnectionTimeoutError as e:
            raise OperationTimeout(f"etcd {where}: {what} timed out after {self.timeout_s}s") from e
        except (etcd_exc.ConnectionFailedError, etcd_exc.NoServerAvailableError) as e:
            raise StorageUnavailable(f"etcd {where}: {what}: server unavailable{hint}") from e
        except etcd_exc.InternalServerError as e:
            raise StorageUnavailable(f"etcd {where}: {what}: internal server error") from e
        except etcd_exc.RevisionCompactedError as e:
            raise CompactedRevision(-1, e.compacted_revision) from e
        except grpc.RpcError as e:
            raise _map_rpc_error(e, where, what) from e
        except etcd_exc.Etcd3Exception as e:
            raise MetadataError(f"etcd {where}: {what}: {type(e).__name__}") from e

    def _stub_call(self, what: str, stub_name: str, method: str, request: _Pb, *, read_only: bool = False,
                   consume: Callable[[_Pb], _Pb] | None = None) -> _Pb:
        """One RPC with failover: when an endpoint is unreachable, the same call moves to
        the next endpoint (at most one try per endpoint). A read moves on any
        ``UNAVAILABLE``; a write only when the request provably never left (the
        connection could not be made), so a write is never applied twice. With auth, a
        call refused for an invalid token re-authenticates and is sent once more (the
        server refused it before applying it). ``request`` may be a factory (for
        streaming calls); ``consume`` runs on the result inside the error mapping."""
        tries = len(self.endpoints)
        attempt = 0
        reauthenticated = False
        while True:
            with self._mapped(what):
                self._revive_if_all_failed()
                stub = getattr(self._client, stub_name)
                try:
                    self._ensure_token()
                    result = getattr(stub, method)(
                        request() if callable(request) else request,
                        self.timeout_s,
                        metadata=self._client.metadata,
                    )
                    return consume(result) if consume is not None else result
                except grpc.RpcError as e:
                    if self._auth is not None and not reauthenticated and _is_invalid_token(e):
                        log.info("etcd %s: auth token no longer valid; authenticating again", what)
                        reauthenticated = True
                        self._drop_token()
                        continue
                    if attempt + 1 < tries and _may_retry_elsewhere(e, read_only):
                        attempt += 1
                        endpoint = self._client.endpoint_in_use
                        log.info("etcd %s: %s unreachable; failing over", what, endpoint.netloc)
                        endpoint.fail()
                        self._client._clear_old_stubs()
                        continue
                    raise

    # -- auth --------------------------------------------------------------
    def _ensure_token(self) -> None:
        """Authenticate on the endpoint in use if there is no token yet (raises the
        gRPC error; the caller maps it). The password is sent only in this request."""
        if self._auth is None or self._authed:
            return
        request = etcdrpc.AuthenticateRequest(name=self._auth.user, password=self._auth.password)
        try:
            resp = self._client.authstub.Authenticate(request, self.timeout_s)
        except grpc.RpcError as e:
            if _auth_not_enabled(e):
                # Like etcd's own client: credentials for a server without auth are unused.
                log.info("etcd: authentication is not enabled on the server; continuing without a token")
                self._client.metadata = None
                self._authed = True
                return
            raise
        self._client.metadata = (("token", resp.token),)
        self._authed = True
        # The watcher sends the token it was built with: new watches need a new one.
        # Old watches keep their stream (it is closed with the client).
        self._client._stubs.pop("watcher", None)

    def _drop_token(self) -> None:
        self._authed = False
        self._client.metadata = None

    def _revive_if_all_failed(self) -> None:
        """pyetcd refuses every call while all endpoints sit in their retry pause. Probe
        the one that failed longest ago instead: a refused connection costs ~1 ms, and a
        restarted server is found by the next call rather than after the pause."""
        endpoints = self._client.endpoints
        if not all(ep.is_failed() for ep in endpoints.values()):
            return
        label = min(endpoints, key=lambda name: endpoints[name].last_failed)
        endpoints[label].last_failed = 0
        self._client._current_endpoint_label = label

    # -- key/value ---------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        return self._get(key, 0)

    def _get(self, key: str, revision: int) -> KeyValue | None:
        check_key(key)
        request = etcdrpc.RangeRequest(key=self._k(key), revision=revision)
        resp = self._stub_call("get", "kvstub", "Range", request, read_only=True)
        return self._kv(resp.kvs[0]) if resp.kvs else None

    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        check_ops([Put(key, value, lease_id)])
        request = etcdrpc.PutRequest(key=self._k(key), value=value, lease=lease_id)
        try:
            resp = self._stub_call("put", "kvstub", "Put", request)
        except MetadataError as e:
            raise _lease_error(e, lease_id) from e.__cause__
        return int(resp.header.revision)

    def delete(self, key: str) -> bool:
        check_key(key)
        resp = self._stub_call("delete", "kvstub", "DeleteRange", etcdrpc.DeleteRangeRequest(key=self._k(key)))
        return bool(resp.deleted > 0)

    def delete_prefix(self, prefix: str) -> int:
        low = self._k(prefix)
        request = etcdrpc.DeleteRangeRequest(key=low or b"\0", range_end=prefix_end(low) or b"\0")
        return int(self._stub_call("delete_prefix", "kvstub", "DeleteRange", request).deleted)

    def range(self, prefix: str, limit: int = 0, start_after: str | None = None) -> list[KeyValue]:
        return self._range(prefix, limit, start_after, 0)

    def _range(self, prefix: str, limit: int, start_after: str | None, revision: int) -> list[KeyValue]:
        low = self._k(prefix)
        high = prefix_end(low) or b"\0"
        if start_after is not None:
            low = max(low, self._k(start_after) + b"\0")
        request = etcdrpc.RangeRequest(
            key=low or b"\0",
            range_end=high,
            limit=max(limit, 0),
            sort_order=etcdrpc.RangeRequest.ASCEND,
            sort_target=etcdrpc.RangeRequest.KEY,
            revision=revision,
        )
        resp = self._stub_call("range", "kvstub", "Range", request, read_only=True)
        return [self._kv(kv) for kv in resp.kvs]

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[ReadView]:
        # etcd keeps every revision until compaction: each read names the same one.
        yield _EtcdView(self, self.current_revision())

    def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        check_ops(success)
        check_ops(failure)
        request = etcdrpc.TxnRequest(
            compare=[self._compare(c) for c in compare],
            success=[self._request_op(op) for op in success],
            failure=[self._request_op(op) for op in failure],
        )
        try:
            resp = self._stub_call("txn", "kvstub", "Txn", request)
        except MetadataError as e:
            lease_ids = [op.lease_id for op in (*success, *failure) if isinstance(op, Put) and op.lease_id]
            raise _lease_error(e, lease_ids[0] if lease_ids else 0) from e.__cause__
        ran = success if resp.succeeded else failure
        responses = [self._response(op, r) for op, r in zip(ran, resp.responses)]
        return TxnResult(resp.succeeded, responses, resp.header.revision)

    def _compare(self, c: Compare) -> _Pb:
        cmp = _COMPARE_CLASSES[c.target](self._k(c.key))
        operand = c.operand
        if c.op == "==":
            cmp = cmp == operand
        elif c.op == "!=":
            cmp = cmp != operand
        elif c.op == "<":
            cmp = cmp < operand
        else:
            cmp = cmp > operand
        return cmp.build_message()

    def _request_op(self, op: Op) -> _Pb:
        if isinstance(op, Put):
            return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=self._k(op.key), value=op.value, lease=op.lease_id))
        if isinstance(op, Delete):
            return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=self._k(op.key)))
        return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=self._k(op.key)))

    def _response(self, op: Op, r: _Pb) -> KeyValue | None | bool:
        if isinstance(op, Get):
            kvs = r.response_range.kvs
            return self._kv(kvs[0]) if kvs else None
        if isinstance(op, Delete):
            return bool(r.response_delete_range.deleted > 0)
        return None

    def current_revision(self) -> int:
        request = etcdrpc.RangeRequest(key=self._k("/"), count_only=True)
        return int(self._stub_call("current_revision", "kvstub", "Range", request, read_only=True).header.revision)

    def compact(self, revision: int) -> None:
        # physical=True waits until the history is really gone, so a watch issued
        # right after sees the compaction.
        request = etcdrpc.CompactionRequest(revision=revision, physical=True)
        try:
            self._stub_call("compact", "kvstub", "Compact", request)
        except MetadataError as e:
            if "compacted" in str(e.__cause__):
                return  # Already compacted at or past this revision: same end state.
            raise

    # -- leases ------------------------------------------------------------
    def grant_lease(self, ttl_s: float) -> Lease:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be positive, got {ttl_s}")
        # etcd counts TTLs in whole seconds.
        request = etcdrpc.LeaseGrantRequest(TTL=max(1, math.ceil(ttl_s)))
        resp = self._stub_call("grant_lease", "leasestub", "LeaseGrant", request)
        return Lease(resp.ID, float(resp.TTL))

    def refresh_lease(self, lease_id: int) -> None:
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
        responses = self._stub_call(
            "refresh_lease", "leasestub", "LeaseKeepAlive", lambda: iter([request]), read_only=True, consume=list
        )
        if not responses or responses[0].TTL <= 0:
            raise LeaseNotFound(f"lease {lease_id:x} expired or was revoked")

    def revoke_lease(self, lease_id: int) -> None:
        try:
            self._stub_call("revoke_lease", "leasestub", "LeaseRevoke", etcdrpc.LeaseRevokeRequest(ID=lease_id))
        except MetadataError as e:
            raise _lease_error(e, lease_id) from e.__cause__

    # -- watches -----------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        if start_revision is None:
            start_revision = self.current_revision() + 1
        watch = Watch(start_revision)
        low = self._k(prefix)

        def on_response(resp: _Pb) -> None:
            if isinstance(resp, BaseException) or resp is None:
                watch._fail(self._watch_error(resp, watch))
                return
            for ev in resp.events:
                if not watch._deliver(self._event(ev)):
                    return

        high = prefix_end(low) or b"\0"
        if self._auth is not None:
            # etcd answers a watch it refuses (bad token, no read permission) with
            # "created + canceled", which pyetcd takes for success: the watch would
            # silently see nothing. A one-key read of the same range proves the token
            # and the permission first (and re-authenticates if needed).
            self._stub_call(
                "watch", "kvstub", "Range",
                etcdrpc.RangeRequest(key=low or b"\0", range_end=high, limit=1, keys_only=True),
                read_only=True,
            )
        with self._mapped("watch"):
            watcher = self._client.watcher
            watch_id = watcher.add_callback(low or b"\0", on_response, range_end=high, start_revision=start_revision)
        watch._cancel_hook = lambda: self._cancel_watch(watcher, watch_id)
        return watch

    def _cancel_watch(self, watcher: _Pb, watch_id: int) -> None:
        with contextlib.suppress(Exception):  # best effort: the server may be gone
            watcher.cancel(watch_id)

    def _watch_error(self, err: BaseException | None, watch: Watch) -> Exception:
        if isinstance(err, etcd_exc.RevisionCompactedError):
            return CompactedRevision(watch.next_revision, err.compacted_revision)
        where = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        error: Exception = StorageUnavailable(f"etcd {where}: watch stream ended")
        if isinstance(err, grpc.RpcError):
            tls_problem = _tls_problem(err)
            if tls_problem is not None:
                error = PermissionDenied(f"etcd {where}: watch: {tls_problem}")
            elif _is_auth_error(err):
                error = _map_rpc_error(err, where, "watch")
        error.__cause__ = err
        return error

    def _event(self, ev: _Pb) -> PutEvent | DeleteEvent:
        if isinstance(ev, pyetcd.events.DeleteEvent):
            return DeleteEvent(self._unk(ev.key), ev.mod_revision)
        return PutEvent(KeyValue(self._unk(ev.key), bytes(ev.value), ev.create_revision, ev.mod_revision, ev.version, ev.lease))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._client.close()

    def __repr__(self) -> str:
        eps = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        return f"EtcdMetadataStore({eps!r}, root={self.root!r})"  # never user, password or token


class _Credentials:
    """User and password, kept out of ``repr``/``vars`` dumps and tracebacks' reprs."""

    __slots__ = ("user", "password")

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self.password = password

    def __repr__(self) -> str:
        return "_Credentials(<redacted>)"


def _read_pem(option: str, path: str, marker: bytes) -> bytes:
    """Read a PEM file for ``option``; errors name the option and path, never the contents."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"etcd {option} {path!r}: cannot read it ({e.strerror or type(e).__name__})") from None
    if b"-----BEGIN " not in data or marker not in data:
        raise ValueError(f"etcd {option} {path!r}: not a PEM file with a {marker.decode().strip('-')} block")
    return data


def _tls_credentials(ca_cert: str | None, cert_cert: str | None, cert_key: str | None) -> _Pb:
    """gRPC channel credentials, or None for plaintext. Any TLS option turns TLS on
    (no ``ca_cert``: the system's trust store); a client cert needs its key and back."""
    if ca_cert is None and cert_cert is None and cert_key is None:
        return None
    if (cert_cert is None) != (cert_key is None):
        raise ValueError("etcd TLS client auth needs both cert_cert and cert_key")
    ca = _read_pem("ca_cert", ca_cert, b"CERTIFICATE-----") if ca_cert is not None else None
    cert = _read_pem("cert_cert", cert_cert, b"CERTIFICATE-----") if cert_cert is not None else None
    key = _read_pem("cert_key", cert_key, b"PRIVATE KEY-----") if cert_key is not None else None
    return grpc.ssl_channel_credentials(ca, key, cert)


#: Words in gRPC's UNAVAILABLE details that mean the TLS handshake or session was
#: refused, i.e. a configuration problem that retrying cannot fix (-> PermissionDenied).
_TLS_PROBLEMS = (
    ("CERTIFICATE_VERIFY_FAILED", "TLS: the server's certificate is not trusted (check ca_cert and that the "
                                  "certificate names this host)"),
    ("security handshaker", "TLS: the client certificate or key is unusable (check cert_cert and cert_key)"),
    ("TSI_DATA_CORRUPTED", "TLS: the server refused the session (client certificate missing or not "
                           "signed by a CA it trusts: check cert_cert and cert_key)"),
    ("Tls handshake failed", "TLS: handshake failed (check ca_cert, cert_cert, cert_key)"),
)

#: UNAVAILABLE details that are ambiguous (a TLS/plaintext mix-up or a server going
#: away mid-handshake): still StorageUnavailable, with a hint in the message.
_UNAVAILABLE_HINTS = (
    ("Handshake read failed", " (the TLS handshake got no answer: is the server speaking TLS?)"),
    ("Socket closed", " (connection closed at once: a TLS server reached without ca_cert?)"),
)


def _unavailable_hint(e: grpc.RpcError) -> str:
    details = _details(e)
    for marker, hint in _UNAVAILABLE_HINTS:
        if marker in details:
            return hint
    return ""


def _tls_problem(e: grpc.RpcError) -> str | None:
    if not hasattr(e, "code") or e.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    details = (e.details() if hasattr(e, "details") else "") or ""
    for marker, problem in _TLS_PROBLEMS:
        if marker in details:
            return problem
    return None


def _details(e: grpc.RpcError) -> str:
    return ((e.details() if hasattr(e, "details") else "") or "") if isinstance(e, grpc.RpcError) else ""


def _is_invalid_token(e: grpc.RpcError) -> bool:
    return "invalid auth token" in _details(e) or "auth token is expired" in _details(e)


def _auth_not_enabled(e: grpc.RpcError) -> bool:
    return "authentication is not enabled" in _details(e)


#: etcd's auth refusals; several come as INVALID_ARGUMENT/FAILED_PRECONDITION.
_AUTH_DETAILS = (
    "authentication failed", "user name is empty", "invalid auth token", "auth token is expired",
    "permission denied", "user name not found",
)


def _is_auth_error(e: grpc.RpcError) -> bool:
    code = e.code() if hasattr(e, "code") else None
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return True
    return any(d in _details(e) for d in _AUTH_DETAILS)


#: gRPC's reconnect back-off grows to 120 s by default: a server restarted after a
#: few refused calls would stay "unavailable" for minutes. Cap it at ~1 s.
RECONNECT_BACKOFF_MS_MIN = 100
RECONNECT_BACKOFF_MS_MAX = 1_000


def _endpoint(host: str, port: int, creds: _Pb, retry_s: float) -> Endpoint:
    # gRPC keepalive notices a dead server while a watch is idle.
    opts = [
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS_MIN),
        ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS_MIN),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS_MAX),
    ]
    return Endpoint(host, port, secure=creds is not None, creds=creds, time_retry=retry_s, opts=opts)


def _may_retry_elsewhere(e: grpc.RpcError, read_only: bool) -> bool:
    """May this failed call be re-sent to another endpoint? Reads: on any UNAVAILABLE.
    Writes: only when gRPC never got a connection (so the server never saw them)."""
    if not hasattr(e, "code") or e.code() != grpc.StatusCode.UNAVAILABLE:
        return False
    if read_only:
        return True
    details = (e.details() if hasattr(e, "details") else "") or ""
    return any(marker in details for marker in _NOT_SENT_MARKERS)


#: gRPC's words for "no connection was made" (the request was never sent).
_NOT_SENT_MARKERS = ("failed to connect", "Failed to connect", "Connection refused", "connections to all backends failing")


def _map_rpc_error(e: grpc.RpcError, where: str, what: str) -> Exception:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else ""
    if _is_auth_error(e):
        # etcd's details are fixed strings ("authentication failed, invalid user ID or
        # password", "permission denied"): they never echo the credentials.
        return PermissionDenied(f"etcd {where}: {what}: {code.name if code else ''} {details}".rstrip())
    if code == grpc.StatusCode.OUT_OF_RANGE and "compacted" in (details or ""):
        return MetadataError(f"etcd {where}: {what}: {details}")
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED):
        return StorageUnavailable(f"etcd {where}: {what}: {code.name}")
    if code == grpc.StatusCode.UNKNOWN:
        # A server stopping mid-request answers with transport-level UNKNOWNs ("Stream
        # removed", "context canceled"): the outcome is unknown, exactly like UNAVAILABLE,
        # so callers must treat it as retryable and re-read, never as a definite failure.
        return StorageUnavailable(f"etcd {where}: {what}: UNKNOWN {details}".rstrip())
    return MetadataError(f"etcd {where}: {what}: {code.name if code else ''} {details}")


def _lease_error(e: MetadataError, lease_id: int) -> MetadataError:
    if "lease not found" in str(e) or "requested lease not found" in str(e.__cause__ or ""):
        return LeaseNotFound(f"lease {lease_id:x} not found")
    return e


class _EtcdView(ReadView):
    """Reads pinned to one etcd revision. If the store is compacted past it meanwhile
    (the revision was current a moment ago, so only a compaction to "now" can do that),
    a read fails with a retryable error: the caller reads a new snapshot."""

    def __init__(self, store: EtcdMetadataStore, revision: int) -> None:
        self.store = store
        self.revision = revision

    def get(self, key: str) -> KeyValue | None:
        with self._pinned():
            return self.store._get(key, self.revision)

    def range(self, prefix: str, limit: int = 0, start_after: str | None = None) -> list[KeyValue]:
        with self._pinned():
            return self.store._range(prefix, limit, start_after, self.revision)

    @contextlib.contextmanager
    def _pinned(self) -> Iterator[None]:
        try:
            yield
        except MetadataError as e:
            if "compacted" not in str(e):
                raise
            raise StorageUnavailable(f"etcd snapshot at revision {self.revision}: compacted meanwhile; "
                                     "read a new snapshot") from e
