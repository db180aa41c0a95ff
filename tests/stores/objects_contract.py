"""The object-store contract: every backend binds this once (see test_objects_*.py).

A binding provides ``objects`` (an open, empty store unique to the test).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from tiered.errors import InvalidKey, InvalidRange, ObjectNotFound, PreconditionFailed
from tiered.objects import ObjectStore, RangeByteRequest, SuffixByteRequest

BIG_BYTES = 13 << 20  # above the S3 binding's multipart threshold: 3 parts of 5 MiB+


class ObjectsContract:
    @pytest.fixture
    def objects(self) -> ObjectStore:
        raise NotImplementedError

    def test_put_get_head_roundtrip(self, objects: ObjectStore) -> None:
        info = objects.put("a/b/obj1", b"hello world")
        assert info.size == 11
        head = objects.head("a/b/obj1")
        assert (head.key, head.size, head.etag) == ("a/b/obj1", 11, info.etag)
        assert head.last_modified > 0
        assert objects.get("a/b/obj1") == b"hello world"
        assert objects.exists("a/b/obj1") and not objects.exists("a/b/nope")

    def test_put_from_file_and_overwrite(self, objects: ObjectStore, tmp_path) -> None:
        src = tmp_path / "src.bin"
        src.write_bytes(b"from a file")
        objects.put("f/x", src)
        assert objects.get("f/x") == b"from a file"
        first = objects.head("f/x").etag
        objects.put("f/x", b"replaced!!")
        assert objects.get("f/x") == b"replaced!!"
        assert objects.head("f/x").etag != first

    def test_large_object_roundtrip(self, objects: ObjectStore, tmp_path) -> None:
        data = os.urandom(BIG_BYTES)
        objects.put("big/bytes", data)
        assert objects.get("big/bytes") == data
        path = tmp_path / "big.bin"
        path.write_bytes(data)
        objects.put("big/file", path, if_absent=True)
        assert objects.head("big/file").size == BIG_BYTES
        assert objects.get_range("big/file", RangeByteRequest(BIG_BYTES - 10, BIG_BYTES + 101)) == data[-10:]
        with pytest.raises(PreconditionFailed):
            objects.put("big/file", path, if_absent=True)

    def test_if_absent_keeps_the_first_object(self, objects: ObjectStore) -> None:
        objects.put("c/once", b"first", if_absent=True)
        with pytest.raises(PreconditionFailed):
            objects.put("c/once", b"second", if_absent=True)
        assert objects.get("c/once") == b"first"

    def test_ranges_and_suffix(self, objects: ObjectStore) -> None:
        objects.put("r/x", bytes(range(100)))
        assert objects.get_range("r/x", RangeByteRequest(10, 20)) == bytes(range(10, 20))
        assert objects.get_range("r/x", RangeByteRequest(95, 1001)) == bytes(range(95, 100))  # clipped
        assert objects.get_range("r/x", RangeByteRequest(0, 1)) == b"\x00"
        assert objects.get_range("r/x", SuffixByteRequest(8)) == bytes(range(92, 100))
        assert objects.get_range("r/x", SuffixByteRequest(1000)) == bytes(range(100))
        assert objects.get_range("r/x", SuffixByteRequest(0)) == b""
        assert objects.get_tail("r/x", 8) == (bytes(range(92, 100)), 100)
        with pytest.raises(InvalidRange):
            objects.get_range("r/x", RangeByteRequest(100, 201))
        with pytest.raises(ValueError):
            objects.get_range("r/x", RangeByteRequest(5, 5))  # empty: end is exclusive
        with pytest.raises(ValueError):
            SuffixByteRequest(-1)
        with pytest.raises(TypeError):
            objects.get_range("r/x", (10, 20))  # type: ignore[arg-type]

    def test_list_in_key_order_under_prefix(self, objects: ObjectStore) -> None:
        for key in ["l/b", "l/a/2", "l/a/1", "l/c", "lz", "m/x"]:
            objects.put(key, key.encode())
        assert [i.key for i in objects.list("l/")] == ["l/a/1", "l/a/2", "l/b", "l/c"]
        assert [i.key for i in objects.list("l/a")] == ["l/a/1", "l/a/2"]
        assert [i.key for i in objects.list("l")] == ["l/a/1", "l/a/2", "l/b", "l/c", "lz"]
        assert sorted(i.key for i in objects.list()) == sorted(["l/b", "l/a/2", "l/a/1", "l/c", "lz", "m/x"])
        assert [i.size for i in objects.list("m/")] == [3]
        assert list(objects.list("nothing/")) == []

    def test_delete_many_deletes_only_the_keys_named_and_ignores_missing_ones(self, objects: ObjectStore) -> None:
        from tiered.objects.base import DELETE_MANY_MAX

        for i in range(5):
            objects.put(f"m/{i}", b"x")
        objects.put("keep/0", b"y")
        objects.delete_many(["m/0", "m/1", "m/2", "m/3", "m/4", "m/absent"])
        objects.delete_many([])
        assert [o.key for o in objects.list()] == ["keep/0"]
        with pytest.raises(ValueError):
            objects.delete_many([f"m/{i}" for i in range(DELETE_MANY_MAX + 1)])
        assert objects.get("keep/0") == b"y"

    def test_missing_objects(self, objects: ObjectStore) -> None:
        for call in (objects.get, objects.head, 
                     lambda k: objects.get_range(k, RangeByteRequest(0, 2)),
                     lambda k: objects.get_range(k, SuffixByteRequest(4))):
            with pytest.raises(ObjectNotFound) as info:
                call("no/such")
            assert isinstance(info.value, FileNotFoundError)
        objects.put("d/x", b"x")
        objects.delete("d/x")
        objects.delete("d/x")  # idempotent, like S3
        assert not objects.exists("d/x")

    @pytest.mark.parametrize("key", ["", "/abs", "../x", "a/../../x", "a//b", "a/./b", "a/", "nul\x00x", "x" * 1100, "a\\b"])
    def test_hostile_keys_are_rejected(self, objects: ObjectStore, key: str) -> None:
        with pytest.raises(InvalidKey):
            objects.put(key, b"x")
        with pytest.raises(InvalidKey):
            objects.get(key)

    def test_racing_if_absent_puts_have_one_winner(self, objects: ObjectStore) -> None:
        def contender(i: int) -> bool:
            try:
                objects.put("race/obj", f"writer {i}".encode() * 1000, if_absent=True)
                return True
            except PreconditionFailed:
                return False

        with ThreadPoolExecutor(8) as pool:
            wins = list(pool.map(contender, range(8)))
        assert wins.count(True) == 1
        winner = wins.index(True)
        assert objects.get("race/obj") == f"writer {winner}".encode() * 1000
