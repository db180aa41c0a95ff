"""verify holds objects to their descriptors, reads metadata as one snapshot, and reports
every inconsistent seal/owner/descriptor state as an error (non-zero exit)."""
from __future__ import annotations

import os

from native import object_format
from tests.cli.helpers import broker, dnb
from tests.cli.test_verify import TOPIC, _kinds, _meta, _object_path, _verify, archived  # noqa: F401 (fixture)
from tiered.metadata import keys
from tiered.objects import open_objects
from tiered.tools.verify import verify_topic
from tiered.archive import list_descriptors


def _descriptor(tmp_path, index: int):
    with _meta(tmp_path) as m:
        return list_descriptors(m, TOPIC)[index]


def test_a_replaced_object_of_the_same_range_and_size_is_a_digest_mismatch(archived):
    real = _descriptor(archived, 1)
    path = _object_path(archived, real)
    records = object_format.read_records(open(path, "rb").read())
    import native

    impostor = object_format.write_object(
        native.encode_batch(real.start_offset, [(r.publish_time, r.key, r.attributes, r.payload.swapcase())
                                                for r in records]),
        topic=TOPIC, zstd_level=0 if real.compression == "none" else 3)
    if len(impostor) != real.size:  # keep the size: only the digest may tell them apart
        impostor = object_format.write_object(
            native.encode_batch(real.start_offset, [(r.publish_time, r.key, r.attributes,
                                                     bytes(b ^ 1 for b in r.payload)) for r in records]),
            topic=TOPIC, zstd_level=0)
    open(path, "wb").write(impostor)
    assert {"digest_mismatch", "size_mismatch"} & _kinds(_verify(archived))


def test_a_larger_object_is_a_size_mismatch(archived):
    desc = _descriptor(archived, 0)
    with open(_object_path(archived, desc), "ab") as f:
        f.write(b"\0" * 100)
    assert _kinds(_verify(archived)) == {"size_mismatch"}


def test_sealed_null_with_descriptors_is_an_error(archived):
    with _meta(archived) as m:
        kv = m.get(keys.state_key(TOPIC))
        state = keys.SealedState.from_json(kv.key, kv.value)
        m.put(kv.key, keys.SealedState(True, None, state.broker_id, state.timestamp).to_json())
    assert "sealed_mismatch" in _kinds(_verify(archived))


def test_sealed_below_the_chain_end_is_an_error(archived):
    with _meta(archived) as m:
        kv = m.get(keys.state_key(TOPIC))
        state = keys.SealedState.from_json(kv.key, kv.value)
        m.put(kv.key, keys.SealedState(True, 9, state.broker_id, state.timestamp).to_json())
    assert "sealed_mismatch" in _kinds(_verify(archived))


def test_a_garbage_owner_record_is_an_error(archived):
    with _meta(archived) as m:
        m.put(keys.owner_key(TOPIC), b'{"broker_id": 7}')
    assert "malformed" in _kinds(_verify(archived))


def test_an_absurd_descriptor_size_is_an_error(archived):
    with _meta(archived) as m:
        kv = m.get(keys.descriptor_key(TOPIC, 5))
        m.put(kv.key, kv.value.replace(b'"size":', b'"size":9' + b"0" * 17 + b",\"was\":"))
    report = _verify(archived)
    assert not report["ok"] and {"malformed", "size_mismatch"} & _kinds(report)


class _MoveDuringRead:
    """Metadata that, right after verify's first read, archives 15-19 and seals at 19 —
    the writes of a move overlapping the verify, at the worst moment."""

    def __init__(self, inner, on_first_range) -> None:
        self.inner, self.on_first_range, self.fired = inner, on_first_range, False

    def range(self, *args, **kw):
        result = self.inner.range(*args, **kw)
        if not self.fired:
            self.fired = True
            self.on_first_range()
        return result

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_verify_overlapping_a_move_sees_one_consistent_snapshot(archived):
    a = broker(archived, "1")
    dnb(*a, "restore", TOPIC)
    dnb(*a, "produce", TOPIC, "--count", "5")
    dnb(*a, "upload", TOPIC)
    with _meta(archived) as m:
        new_desc = m.get(keys.descriptor_key(TOPIC, 15))
        state = m.get(keys.state_key(TOPIC))
        owner = m.get(keys.owner_key(TOPIC))
        # Rewind to "sealed at 14, released" — the moment before the other broker's move.
        m.delete(new_desc.key)
        sealed_14 = keys.SealedState(True, 14, "1", 0.0).to_json()
        m.put(state.key, sealed_14)
        released = owner.value[:-1] + b',"released_at":1.0}'
        m.put(owner.key, released)
    assert _verify(archived)["ok"]

    def move() -> None:
        with _meta(archived) as m2:
            m2.put(new_desc.key, new_desc.value)
            m2.put(state.key, keys.SealedState(True, 19, "1", 0.0).to_json())

    with _meta(archived) as m, open_objects(f"file://{archived}/objects") as objects:
        report = verify_topic(TOPIC, _MoveDuringRead(m, move), objects)
    assert report.ok, report.problems
    assert _verify(archived)["ok"]  # and the state after the move is consistent too


def test_wal_tail_rule_is_recoverys(tmp_path):
    """A bad_length stop in the last segment followed by a later commit round is corruption
    for recovery, so it must be for verify too."""
    import struct

    from native.format import ROUND_MARKER_BYTES, SEGMENT_HEADER_BYTES

    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "5")
    dnb(*a, "produce", TOPIC, "--count", "5")  # a second commit round after the first
    wal_dir = tmp_path / "broker-1" / "wal" / "default" / "t"
    seg = wal_dir / sorted(n for n in os.listdir(wal_dir) if n.endswith(".seg"))[-1]
    data = bytearray(seg.read_bytes())
    frame0 = SEGMENT_HEADER_BYTES + ROUND_MARKER_BYTES  # behind the first round's marker
    first_len = struct.unpack_from("<I", data, frame0 + 4)[0]
    struct.pack_into("<I", data, frame0 + 4, 0)  # frame 0: impossible length; the rest stays valid
    seg.write_bytes(bytes(data))
    assert first_len > 0
    with _meta(tmp_path) as m, open_objects(f"file://{tmp_path}/objects") as objects:
        report = verify_topic(TOPIC, m, objects, wal_dir=str(tmp_path / "broker-1" / "wal"))
    assert "wal_corrupt" in {p["kind"] for p in report.problems}


def test_verify_reports_a_local_wal_whose_segments_are_gone(tmp_path) -> None:
    """With every segment deleted but the checkpoint kept, each
    load refuses the WAL (the checkpoint recorded durable offsets), yet verify said OK."""
    import os as _os

    from tiered.tools.verify import VerifyReport, _scan_wal
    from wal import WriteAheadLog

    wal = WriteAheadLog.open(str(tmp_path), "/default/t")
    for i in range(5):
        wal.append(b"m%d" % i)
    wal.flush()
    wal.close()
    directory = _os.path.join(str(tmp_path), "default", "t")
    for name in _os.listdir(directory):
        if name.endswith(".seg"):
            _os.remove(_os.path.join(directory, name))
    report = VerifyReport("/default/t")
    _scan_wal(directory, report)
    assert [p["kind"] for p in report.problems] == ["wal_corrupt"]
