"""The one topic-name validator.

Every path on disk (WAL directories), every object key and every metadata key is
built from a :class:`TopicName`, never from a raw string, so a hostile name cannot
traverse out of the WAL directory, the bucket prefix or the key space.

A topic name looks like ``/namespace/topic``. Each segment is 1..128 characters
from ``[A-Za-z0-9._-]`` and may not start with ``.``: that rules out ``.`` and ``..``, and
keeps every topic directory apart from the dot-directories the storage layer keeps beside
them (``.quarantine`` under the WAL root, ``.dnb-tmp`` in a local object store).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from wal.errors import InvalidTopicName

_SEGMENT_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
_NAME_CHARS_MAX = 260


@dataclass(frozen=True, slots=True)
class TopicName:
    """A validated ``/namespace/topic`` name."""

    namespace: str
    name: str

    @classmethod
    def parse(cls, raw: "str | TopicName") -> "TopicName":
        if isinstance(raw, TopicName):
            return raw
        if not isinstance(raw, str):
            raise InvalidTopicName(f"topic name must be a string, got {type(raw).__name__}")
        if len(raw) > _NAME_CHARS_MAX:
            raise InvalidTopicName(f"topic name is {len(raw)} characters long (max {_NAME_CHARS_MAX})")
        parts = raw.split("/")
        # A leading slash is the canonical form; "ns/topic" is accepted as well.
        if parts and parts[0] == "":
            parts = parts[1:]
        if len(parts) != 2:
            raise InvalidTopicName(f"topic name {raw!r} must look like /namespace/topic")
        for part in parts:
            _check_segment(raw, part)
        return cls(parts[0], parts[1])

    def __str__(self) -> str:
        return f"/{self.namespace}/{self.name}"

    @property
    def path(self) -> str:
        """Relative path ``namespace/topic`` (safe to join under a base directory)."""
        return f"{self.namespace}/{self.name}"


def _check_segment(raw: str, part: str) -> None:
    if part.startswith("."):
        raise InvalidTopicName(f"topic name {raw!r}: segment {part!r} may not start with '.'")
    if not _SEGMENT_RE.fullmatch(part):
        raise InvalidTopicName(
            f"topic name {raw!r}: segment {part!r} must be 1-128 characters of [A-Za-z0-9._-]"
        )
