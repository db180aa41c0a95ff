"""The archive invariants every test ends with."""
from __future__ import annotations

from collections.abc import Callable

from tiered.archive import list_descriptors
from tiered.archive.fetch import object_frames
from tiered.archive.naming import object_key
from tiered.archive.orphans import find_orphans
from uploader import collect_garbage


def assert_archive(env, expected_frames: Callable[[int, int], bytes], first_offset: int,
                   tip: int, gc: bool = True) -> list:
    """Descriptors contiguous from ``first_offset`` to ``tip``, each object holding exactly
    its frames; after GC no orphan is left, so no offset is archived twice."""
    descriptors = list_descriptors(env.raw_metadata, env.topic)
    assert descriptors, "nothing archived"
    assert descriptors[0].start_offset == first_offset
    for prev, cur in zip(descriptors, descriptors[1:]):
        assert cur.start_offset == prev.end_offset + 1, (prev, cur)
    assert descriptors[-1].end_offset == tip
    for d in descriptors:
        key = object_key(env.topic, d.start_offset, d.object_id)
        data = env.raw_objects.get(key)
        assert d.size == len(data)
        assert object_frames(data, key, env.topic) == expected_frames(d.start_offset, d.end_offset), key
    if gc:
        collect_garbage(env.raw_metadata, env.raw_objects, env.topic, grace_s=0)
        assert find_orphans(env.raw_metadata, env.raw_objects, env.topic) == []
    return descriptors
