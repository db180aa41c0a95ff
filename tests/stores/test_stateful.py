"""Hypothesis stateful tests: each backend against a small in-memory model.

The metadata model is etcd's semantics as ``tiered/metadata/base.py`` states them (one
revision per writing transaction, create/mod revision and version per key, compares,
ops applied in order inside a txn, range in key order with a limit). The object model
is a dict. SQLite and a private real etcd are compared with the same machine; the
local directory and moto over HTTP likewise. Example counts are bounded so the suite
stays fast (etcd ~15 s at most on 2 cores).
"""
from __future__ import annotations

import os
import tempfile
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tiered.errors import InvalidRange, ObjectNotFound, PreconditionFailed
from tiered.metadata.base import Compare, Delete, Get, KeyValue, Put
from tiered.objects import RangeByteRequest, SuffixByteRequest

# -- metadata model ----------------------------------------------------------------
KEYS = ["/a", "/a/1", "/a/2", "/a/2/x", "/ab", "/b"]
PREFIXES = ["/", "/a", "/a/", "/a/2", "/b", "/c"]
VALUES = [b"", b"x", b"y", b"\x00\xff"]
TARGETS = ["value", "version", "create_revision", "mod_revision"]
OPS = ["==", "!=", "<", ">"]


class MetaModel:
    def __init__(self, revision: int) -> None:
        self.revision = revision
        self.kvs: dict[str, KeyValue] = {}

    def apply(self, ops, new_revision: int) -> tuple[list, bool]:
        """Apply ops in order as one etcd txn at ``new_revision``; (responses, wrote?)."""
        responses, wrote = [], False
        for op in ops:
            if isinstance(op, Get):
                responses.append(self.kvs.get(op.key))
            elif isinstance(op, Put):
                old = self.kvs.get(op.key)
                self.kvs[op.key] = KeyValue(op.key, op.value, new_revision if old is None else old.create_revision,
                                            new_revision, 1 if old is None else old.version + 1, 0)
                responses.append(None)
                wrote = True
            else:
                existed = self.kvs.pop(op.key, None) is not None
                responses.append(existed)
                wrote = wrote or existed
        return responses, wrote


class MetadataMachine(RuleBasedStateMachine):
    """Bind by subclassing and defining ``open_store`` (a fresh, empty store)."""

    def open_store(self):
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.store = self.open_store()
        self.model = MetaModel(self.store.current_revision())

    def teardown(self) -> None:
        self.store.close()

    # Writes ----------------------------------------------------------------------
    @rule(key=st.sampled_from(KEYS), value=st.sampled_from(VALUES))
    def put(self, key, value):
        revision = self.store.put(key, value)
        self.model.apply([Put(key, value)], self.model.revision + 1)
        self.model.revision += 1
        assert revision == self.model.revision

    @rule(key=st.sampled_from(KEYS))
    def delete(self, key):
        _, wrote = self.model.apply([Delete(key)], self.model.revision + 1)
        self.model.revision += wrote
        assert self.store.delete(key) is wrote

    @rule(data=st.data())
    def txn(self, data):
        compares = data.draw(st.lists(self._compare(data), max_size=3), label="compare")
        success = self._ops(data, "success")
        failure = self._ops(data, "failure")
        result = self.store.txn(compares, success, failure)
        holds = all(c.holds(self.model.kvs.get(c.key)) for c in compares)
        responses, wrote = self.model.apply(success if holds else failure, self.model.revision + 1)
        self.model.revision += wrote
        assert result.succeeded is holds
        assert result.responses == responses
        assert result.revision == self.model.revision

    def _compare(self, data):
        @st.composite
        def one(draw):
            key = draw(st.sampled_from(KEYS))
            target = draw(st.sampled_from(TARGETS))
            op = draw(st.sampled_from(OPS))
            if target == "value":
                operand = draw(st.sampled_from(VALUES))
            else:  # near the current number, so compares are true about as often as false
                kv = self.model.kvs.get(key)
                current = 0 if kv is None else getattr(kv, target)
                operand = max(0, current + draw(st.sampled_from([-1, 0, 0, 1])))
            return Compare(key, target, op, operand)

        return one()

    def _ops(self, data, label):
        raw = data.draw(st.lists(st.tuples(st.sampled_from(["put", "delete", "get"]), st.sampled_from(KEYS),
                                           st.sampled_from(VALUES)), max_size=4), label=label)
        ops, written = [], set()
        for kind, key, value in raw:
            if kind == "get":
                ops.append(Get(key))
            elif key not in written:  # a key may be written once per op list
                written.add(key)
                ops.append(Put(key, value) if kind == "put" else Delete(key))
        return ops

    # Reads -------------------------------------------------------------------------
    @rule(key=st.sampled_from(KEYS))
    def get(self, key):
        assert self.store.get(key) == self.model.kvs.get(key)

    @rule(prefix=st.sampled_from(PREFIXES), limit=st.integers(0, 3),
          start_after=st.none() | st.sampled_from(KEYS))
    def range(self, prefix, limit, start_after):
        expected = [kv for k, kv in sorted(self.model.kvs.items(), key=lambda item: item[0].encode())
                    if k.startswith(prefix) and (start_after is None or k.encode() > start_after.encode())]
        if limit:
            expected = expected[:limit]
        assert self.store.range(prefix, limit=limit, start_after=start_after) == expected

    @invariant()
    def revision_matches(self):
        assert self.store.current_revision() == self.model.revision


META_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)


class SqliteMachine(MetadataMachine):
    def open_store(self):
        from tiered.metadata.sqlite import SqliteMetadataStore

        self._dir = tempfile.TemporaryDirectory(prefix="dnb-stateful-")
        return SqliteMetadataStore(os.path.join(self._dir.name, "m.db"))

    def teardown(self) -> None:
        super().teardown()
        self._dir.cleanup()


TestSqliteAgainstModel = SqliteMachine.TestCase
TestSqliteAgainstModel.settings = settings(max_examples=40, stateful_step_count=25, **META_SETTINGS)


@pytest.fixture(scope="module")
def private_etcd():
    """A private server: lease expiries of other tests on the shared one would bump
    the global revision under the model."""
    from tests.fixtures.servers import EtcdServer

    server = EtcdServer().start()
    yield server
    server.cleanup()


@pytest.mark.etcd
def test_etcd_against_model(private_etcd):
    from hypothesis.stateful import run_state_machine_as_test

    from tiered.metadata.etcd import EtcdMetadataStore

    class EtcdMachine(MetadataMachine):
        def open_store(self):
            return EtcdMetadataStore([private_etcd.endpoint], root=f"/m-{uuid.uuid4().hex[:10]}", timeout_s=5)

    run_state_machine_as_test(EtcdMachine, settings=settings(max_examples=30, stateful_step_count=20, **META_SETTINGS))


# -- object model ------------------------------------------------------------------
# No key is a "directory" of another: a local directory cannot hold both "x" and "x/1".
OBJ_KEYS = ["x/1", "x/2", "x/z/1", "xy", "y/1"]
OBJ_PREFIXES = ["", "x", "x/", "x/z/", "y/", "q/"]
DATA = st.binary(min_size=1, max_size=64) | st.sampled_from([b"", b"same"])


class ObjectsMachine(RuleBasedStateMachine):
    """Bind by subclassing and defining ``open_store`` (a fresh, empty store)."""

    def open_store(self):
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.store = self.open_store()
        self.model: dict[str, bytes] = {}

    def teardown(self) -> None:
        self.store.close()

    @rule(key=st.sampled_from(OBJ_KEYS), data=DATA, if_absent=st.booleans())
    def put(self, key, data, if_absent):
        if if_absent and key in self.model:
            with pytest.raises(PreconditionFailed):
                self.store.put(key, data, if_absent=True)
            return
        info = self.store.put(key, data, if_absent=if_absent)
        self.model[key] = data
        assert (info.key, info.size) == (key, len(data))

    @rule(key=st.sampled_from(OBJ_KEYS))
    def get(self, key):
        if key not in self.model:
            with pytest.raises(ObjectNotFound):
                self.store.get(key)
        else:
            assert self.store.get(key) == self.model[key]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def get_range(self, data):
        key = data.draw(st.sampled_from(sorted(self.model)))
        size = len(self.model[key])
        start = data.draw(st.integers(0, size + 2))
        end = data.draw(st.integers(start, size + 10))
        if start >= size:
            with pytest.raises(InvalidRange):
                self.store.get_range(key, RangeByteRequest(start, end + 1))
        else:
            assert self.store.get_range(key, RangeByteRequest(start, end + 1)) == self.model[key][start:end + 1]

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def get_suffix(self, data):
        key = data.draw(st.sampled_from(sorted(k for k, v in self.model.items() if v)))
        n = data.draw(st.integers(0, len(self.model[key]) + 5))
        assert self.store.get_range(key, SuffixByteRequest(n)) == (self.model[key][-n:] if n else b"")

    @rule(key=st.sampled_from(OBJ_KEYS))
    def head(self, key):
        if key not in self.model:
            assert not self.store.exists(key)
            with pytest.raises(ObjectNotFound):
                self.store.head(key)
        else:
            assert self.store.head(key).size == len(self.model[key])

    @rule(prefix=st.sampled_from(OBJ_PREFIXES))
    def list(self, prefix):
        listed = [(i.key, i.size) for i in self.store.list(prefix)]
        expected = [(k, len(v)) for k, v in sorted(self.model.items(), key=lambda kv: kv[0].encode())
                    if k.startswith(prefix)]
        assert listed == expected

    @rule(key=st.sampled_from(OBJ_KEYS))
    def delete(self, key):
        self.store.delete(key)  # idempotent: a missing key is not an error
        self.model.pop(key, None)
        assert not self.store.exists(key)


OBJ_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck))


class LocalObjectsMachine(ObjectsMachine):
    def open_store(self):
        from tiered.objects.local import LocalObjectStore

        self._dir = tempfile.TemporaryDirectory(prefix="dnb-stateful-obj-")
        return LocalObjectStore(self._dir.name)

    def teardown(self) -> None:
        super().teardown()
        self._dir.cleanup()


TestLocalObjectsAgainstModel = LocalObjectsMachine.TestCase
TestLocalObjectsAgainstModel.settings = settings(max_examples=40, stateful_step_count=25, **OBJ_SETTINGS)


@pytest.mark.s3
def test_s3_against_model(moto_server):
    import boto3
    from hypothesis.stateful import run_state_machine_as_test

    from tiered.objects.s3 import S3ObjectStore

    client = boto3.client("s3", endpoint_url=moto_server.endpoint_url, region_name="us-east-1")

    class S3Machine(ObjectsMachine):
        def open_store(self):
            bucket = f"sm-{uuid.uuid4().hex[:16]}"
            client.create_bucket(Bucket=bucket)
            return S3ObjectStore(bucket, "pre/fix", endpoint_url=moto_server.endpoint_url, max_attempts=2)

    run_state_machine_as_test(S3Machine, settings=settings(max_examples=10, stateful_step_count=15, **OBJ_SETTINGS))
