"""What append_batch accepts, and the exact encoded size of a record (for size limits).

A batch element is one of:
  * ``bytes`` (or bytearray/memoryview): a payload with no key and no attributes;
  * a tuple ``(payload, key, attributes, publish_time)`` (trailing items may be omitted);
  * a :class:`Message` (or any other sequence in the tuple's order).
The append core (``native.AppendBuffer``) handles bytes and tuples itself, in C for the
compiled twin; only the other forms call back into :func:`as_tuple`, once per such message.
Size limits are checked by the core on the exact encoded record length.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from native.format import RECORD_FIXED_BYTES


@dataclass(frozen=True, slots=True)
class Message:
    payload: bytes
    key: bytes | None = None
    attributes: Mapping[str, str] | None = None
    publish_time: int | None = None  # ms since the epoch; None: the time of the append


def record_bytes(payload: bytes, key: bytes | None, attributes: Mapping[str, str] | None) -> int:
    """Encoded record length, exactly as native/format.py lays it out."""
    size = RECORD_FIXED_BYTES + len(payload)
    if key is not None:
        size += 4 + len(key)
    if attributes:
        size += 2 + sum(6 + len(k.encode()) + len(v.encode()) for k, v in attributes.items())
    return size


def as_tuple(message: object) -> tuple[object, ...]:
    """``(payload, key, attributes, publish_time)`` of a batch element that is neither bytes
    nor a tuple; the core validates the fields and the length."""
    if isinstance(message, Message):
        return (message.payload, message.key, message.attributes, message.publish_time)
    if isinstance(message, (str, bytes, bytearray, memoryview)) or not hasattr(message, "__len__"):
        # A bytes subclass or a str would otherwise be split into characters.
        return (message,)
    return tuple(cast(Iterable[object], message))  # any other sized sequence; the core checks it
