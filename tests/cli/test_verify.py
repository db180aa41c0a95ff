"""verify catches a gap, an overlap, a corrupt object, a missing object, an orphan, a wrong
seal and a local WAL that does not join the archive; exit 0 only when ok."""
from __future__ import annotations

import os

import pytest

from tests.cli.helpers import broker, dnb
from tiered.metadata import keys, open_metadata
from tiered.archive import list_descriptors
from tiered.archive.naming import object_key
from wal.topics import TopicName

TOPIC = "/default/t"


@pytest.fixture
def archived(tmp_path):
    """Three committed objects 0-4, 5-9, 10-14 on broker 1, then sealed."""
    a = broker(tmp_path, "1")
    for _ in range(3):
        dnb(*a, "produce", TOPIC, "--count", "5")
        dnb(*a, "upload", TOPIC)
    assert dnb(*a, "--json", "seal", TOPIC).json() == {"last_committed_offset": 14}
    assert dnb(*a, "--json", "verify", TOPIC).json() == {"ok": True, "problems": []}
    return tmp_path


def _meta(tmp_path):
    return open_metadata(f"sqlite:///{tmp_path}/shared.db")


def _verify(tmp_path):
    run = dnb(*broker(tmp_path, "1"), "--json", "verify", TOPIC)
    report = run.json()
    assert set(report) == {"ok", "problems"}
    lost = any(p["kind"] == "lost_range" for p in report["problems"])
    assert run.rc == (1 if not report["ok"] else 6 if lost else 0)
    return report


def _kinds(report):
    return {p["kind"] for p in report["problems"] if p["severity"] == "error"}


def _object_path(tmp_path, desc):
    return os.path.join(tmp_path, "objects", object_key(TopicName.parse(TOPIC), desc.start_offset, desc.object_id))


def test_gap(archived):
    with _meta(archived) as m:
        m.delete(keys.descriptor_key(TOPIC, 5))
    report = _verify(archived)
    assert "gap" in _kinds(report)
    gap = next(p for p in report["problems"] if p["kind"] == "gap")
    assert (gap["first_offset"], gap["last_offset"]) == (5, 9)
    # The object of the deleted descriptor is now garbage inside the archived range (listed).
    assert any(p["kind"] == "orphan" for p in report["problems"])


def test_overlap(archived):
    with _meta(archived) as m:
        middle = list_descriptors(m, TOPIC)[1]
        bogus = keys.ObjectDescriptor(7, 12, "data-7-12", middle.size, middle.etag, middle.created_at,
                                      middle.broker_id, middle.epoch, middle.footer_crc32c,
                                      middle.block_crc32c)
        m.put(keys.descriptor_key(TOPIC, 7), bogus.to_json())
    assert {"overlap", "missing_object"} <= _kinds(_verify(archived))


def test_corrupt_object(archived):
    with _meta(archived) as m:
        desc = list_descriptors(m, TOPIC)[1]
    path = _object_path(archived, desc)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 3] ^= 0x40
    open(path, "wb").write(bytes(data))
    report = _verify(archived)
    assert _kinds(report) == {"corrupt_object"}
    assert desc.object_id in report["problems"][0]["message"]


def test_an_object_pinned_by_its_descriptor_but_naming_another_topic_is_corrupt(archived):
    # The same frames in an object that names another topic, pinned by its descriptor (size
    # and digest), as an uploader that adopted it would have committed it: every reader
    # refuses it, so verify must too (atk58 F01), not rate the archive sound.
    import dataclasses

    from tiered.archive import fetch

    with _meta(archived) as m:
        desc = list_descriptors(m, TOPIC)[1]
        path = _object_path(archived, desc)
        key = object_key(TopicName.parse(TOPIC), desc.start_offset, desc.object_id)
        frames = fetch.object_frames(open(path, "rb").read(), key, TOPIC)
        foreign = fetch.encode_object("/default/other", frames, block_bytes=1 << 20, zstd_level=0)
        open(path, "wb").write(foreign)
        digest = fetch.object_digest(foreign, key)
        pinned = dataclasses.replace(desc, size=len(foreign), footer_crc32c=digest.footer_crc32c,
                                     block_crc32c=digest.block_crc32c)
        m.put(keys.descriptor_key(TOPIC, desc.start_offset), pinned.to_json())
    report = _verify(archived)
    assert _kinds(report) == {"corrupt_object"}
    assert "other" in report["problems"][0]["message"]


def test_missing_object(archived):
    with _meta(archived) as m:
        desc = list_descriptors(m, TOPIC)[0]
    os.remove(_object_path(archived, desc))
    assert _kinds(_verify(archived)) == {"missing_object"}


def test_orphans_are_warnings_and_gc_deletes_the_ones_inside_the_archive(archived):
    with _meta(archived) as m:
        desc = list_descriptors(m, TOPIC)[0]
    src = _object_path(archived, desc)
    topic = TopicName.parse(TOPIC)
    inside = os.path.join(archived, "objects", object_key(topic, 0, "data-0-4-e9"))
    past = os.path.join(archived, "objects", object_key(topic, 15, "data-15-19"))
    for path in (inside, past):
        with open(src, "rb") as f, open(path, "wb") as g:
            g.write(f.read())
    report = _verify(archived)
    assert _kinds(report) == set()
    severities = {p["key"].rsplit("/", 1)[-1]: p["severity"] for p in report["problems"]}
    # Garbage is never served (no descriptor names it): a warning, and `dnb gc` collects it.
    assert severities == {os.path.basename(inside): "warning", os.path.basename(past): "warning"}
    assert report["ok"] is True
    run = dnb(*broker(archived, "1"), "--json", "gc", TOPIC, "--grace-s", "0")
    assert run.rc == 0 and run.json()["deleted"] == [object_key(topic, 0, "data-0-4-e9")]
    assert not os.path.exists(inside) and os.path.exists(past)  # past the tip: maybe an upload in flight


def test_sealed_state_that_disagrees_with_the_archive(archived):
    with _meta(archived) as m:
        kv = m.get(keys.state_key(TOPIC))
        state = keys.SealedState.from_json(kv.key, kv.value)
        m.put(kv.key, keys.SealedState(True, 20, state.broker_id, state.timestamp).to_json())
    assert "sealed_mismatch" in _kinds(_verify(archived))


def test_local_wal_that_does_not_join_the_archive(tmp_path):
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "5")
    dnb(*a, "upload", TOPIC)
    dnb(*a, "produce", TOPIC, "--count", "5")
    assert dnb(*a, "--json", "verify", TOPIC).json()["ok"]
    with _meta(tmp_path) as m:  # forget the only descriptor: the WAL (0-9) now starts... fine,
        m.delete(keys.descriptor_key(TOPIC, 0))  # but its object becomes garbage
    # A WAL starting past the archive's end + 1 is a hole nobody can serve.
    wal_dir = tmp_path / "broker-1" / "wal" / "default" / "t"
    first = sorted(n for n in os.listdir(wal_dir) if not n.startswith("."))[0]
    assert first.endswith(".seg")
    from tiered.tools.verify import VerifyReport, _check_local_wal, _LocalWal

    with _meta(tmp_path) as m:
        local = _LocalWal.scan(TopicName.parse(TOPIC), str(tmp_path / "broker-1" / "wal"), m, VerifyReport(TOPIC))
    assert local is not None
    report = VerifyReport(TOPIC, archive_last_offset=2)
    _check_local_wal(local, report)
    assert report.ok
    report = VerifyReport(TOPIC, archive_last_offset=-5)
    _check_local_wal(local, report)
    assert [p["kind"] for p in report.problems] == ["wal_gap"]


def test_table_output_and_skip_objects(archived):
    run = dnb(*broker(archived, "1"), "verify", TOPIC)
    assert run.rc == 0 and "3 descriptor(s), 3 object(s) read" in run.out
    run = dnb(*broker(archived, "1"), "verify", "--skip-objects", TOPIC)
    assert run.rc == 0 and "0 object(s) read" in run.out


def test_an_archive_start_inside_an_object_is_an_overlap_as_restore_says(archived):
    """An archive-start record inside object 5-9 (a cut's start is always an object
    boundary): a restore refuses this chain, so verify must not call it whole (atk33 F08)."""
    with _meta(archived) as m:
        m.put(keys.archive_start_key(TOPIC), keys.ArchiveStart(7, "1", 1, 1.0).to_json())
    report = _verify(archived)
    assert "overlap" in _kinds(report)
    assert dnb(*broker(archived, "2"), "restore", TOPIC).rc == 5


def test_an_object_symlinked_out_of_the_store_is_a_problem_not_a_usage_error(archived):
    """verify reports an object it cannot read (a symlink out of the local store) as a
    damaged object of the topic, not as the operator's bad input, exit 2 (atk33 F07)."""
    with _meta(archived) as m:
        desc = list_descriptors(m, TOPIC)[1]
    path = _object_path(archived, desc)
    os.remove(path)
    os.symlink("/etc/hostname", path)
    assert _kinds(_verify(archived)) == {"corrupt_object"}


@pytest.mark.parametrize("damage", ["the WAL id file", "a renamed segment", "a segment shorter than a header",
                                    "a segment name recovery ignores", "a directory named like a segment"])
def test_a_local_wal_that_would_not_open_is_wal_corrupt(tmp_path, damage):
    """The local WAL holds 0-9 unarchived; damage that makes recovery refuse it (consume and
    produce then exit 5) must make verify say so, not call the topic whole (atk33 F05,
    atk35 F04, F07: verify runs recovery's own checks, read-only)."""
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "10")
    wal_dir = tmp_path / "broker-1" / "wal" / "default" / "t"
    [segment] = [n for n in os.listdir(wal_dir) if n.endswith(".seg")]
    if damage == "the WAL id file":
        (wal_dir / ".walid").write_bytes(b"\0\0\0")
    elif damage == "a renamed segment":
        os.rename(wal_dir / segment, wal_dir / f"{5:020d}.seg")
    elif damage == "a segment shorter than a header":
        (wal_dir / f"{10:020d}.seg").write_bytes(b"")
    elif damage == "a directory named like a segment":
        os.mkdir(wal_dir / f"{10:020d}.seg")
    else:
        os.rename(wal_dir / segment, wal_dir / "0.seg")
    assert dnb(*a, "consume", TOPIC, "--subscription", "s").rc == 5
    assert "wal_corrupt" in _kinds(_verify(tmp_path))


def test_a_local_wal_that_starts_past_an_empty_archive_is_a_gap(tmp_path):
    """Nothing archived, and the WAL's oldest segment is gone with its checkpoint: it
    starts at 5, so a load finds it does not join the archive and renumbers from 0. verify
    must say so (atk35 F05)."""
    a = [*broker(tmp_path, "1"), "--set", "wal.segment_bytes_max=4096"]
    dnb(*a, "produce", TOPIC, "--count", "5", "--size", "1000")
    dnb(*a, "produce", TOPIC, "--count", "5", "--size", "1000")
    wal_dir = tmp_path / "broker-1" / "wal" / "default" / "t"
    segments = sorted(n for n in os.listdir(wal_dir) if n.endswith(".seg"))
    assert len(segments) > 1
    os.remove(wal_dir / segments[0])
    os.remove(wal_dir / "wal.ckpt")
    report = _verify(tmp_path)
    assert "wal_gap" in _kinds(report)


def test_a_seal_that_disagrees_with_the_archive_stays_reported_after_a_restore_failed_on_it(archived):
    """A failed restore keeps the owner record it took; the state still says sealed, so the
    mismatch every restore refuses is still a problem (atk35 F06)."""
    with _meta(archived) as m:
        kv = m.get(keys.state_key(TOPIC))
        state = keys.SealedState.from_json(kv.key, kv.value)
        m.put(kv.key, keys.SealedState(True, 12, state.broker_id, state.timestamp).to_json())
    assert "sealed_mismatch" in _kinds(_verify(archived))
    assert dnb(*broker(archived, "2"), "restore", TOPIC).rc == 5
    assert "sealed_mismatch" in _kinds(_verify(archived))


def test_verify_of_an_unknown_topic_or_store_is_not_whole_and_creates_nothing(tmp_path):
    """Like inspect: a name nobody created is not found (exit 7), and a read-only command
    never creates the store a typo named (atk35 F08)."""
    a = broker(tmp_path, "1")
    dnb(*a, "produce", TOPIC, "--count", "1")
    assert dnb(*a, "verify", "/default/tpyo").rc == 7
    typo = tmp_path / "metadta.db"
    for command in ("verify", "inspect"):
        run = dnb("--data-dir", str(tmp_path / "broker-1"), "--broker-id", "1", "--metadata", f"sqlite:///{typo}",
                  "--objects", f"file://{tmp_path}/objects", command, TOPIC)
        assert run.rc == 7 and "no metadata store" in run.err
    assert not typo.exists()
