"""What append_batch accepts, and the exact encoded size of a record (for size limits).

A batch element is one of:
  * ``bytes`` (or bytearray/memoryview): a payload with no key and no attributes;
  * a :class:`Message`;
  * a tuple ``(payload, key, attributes, publish_time)`` (trailing items may be omitted).
A batch of plain payloads takes a fast path with no per-message Python work beyond
building the codec's input tuple.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from native.format import RECORD_FIXED_BYTES
from wal.errors import MessageTooLarge

_PLAIN_TYPES = frozenset({bytes, bytearray, memoryview})


@dataclass(frozen=True, slots=True)
class Message:
    payload: bytes
    key: bytes | None = None
    attributes: Mapping[str, str] | None = None
    publish_time: int | None = None  # ms since the epoch; None: the time of the append


def record_bytes(payload, key, attributes) -> int:
    """Encoded record length, exactly as native/format.py lays it out."""
    size = RECORD_FIXED_BYTES + len(payload)
    if key is not None:
        size += 4 + len(key)
    if attributes:
        size += 2 + sum(6 + len(k.encode()) + len(v.encode()) for k, v in attributes.items())
    return size


def normalize_batch(messages: Sequence, now_ms: int, max_message_bytes: int) -> list[tuple]:
    """Codec input tuples ``(publish_time, key, attributes, payload)``; raises on oversize."""
    if not messages:
        raise ValueError("append_batch needs at least one message")
    if set(map(type, messages)) <= _PLAIN_TYPES:
        largest = max(map(len, messages))
        if RECORD_FIXED_BYTES + largest > max_message_bytes:
            raise MessageTooLarge(f"payload of {largest} bytes exceeds max_message_bytes {max_message_bytes}")
        return [(now_ms, None, None, m) for m in messages]
    return [_one(m, now_ms, max_message_bytes) for m in messages]


def _one(message, now_ms: int, max_message_bytes: int) -> tuple:
    if type(message) in _PLAIN_TYPES:
        payload, key, attributes, publish_time = message, None, None, None
    elif isinstance(message, Message):
        payload, key, attributes, publish_time = (message.payload, message.key, message.attributes,
                                                  message.publish_time)
    else:
        payload, key, attributes, publish_time = (tuple(message) + (None, None, None))[:4]
    size = record_bytes(payload, key, attributes)
    if size > max_message_bytes:
        raise MessageTooLarge(f"record of {size} bytes exceeds max_message_bytes {max_message_bytes}")
    return (now_ms if publish_time is None else publish_time, key, attributes, payload)
