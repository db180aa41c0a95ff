"""The message type a tiered reader yields to consumers.

A :class:`Message` is the stored record (``native.Record``: offset, publish_time, key,
attributes, payload) plus ``tier``, the storage tier that served it:

* ``"cloud"``: decoded from an archived dnb1 object in the object store;
* ``"wal"``: replayed from the local write-ahead log (it was already durable when the
  reader reached the WAL);
* ``"live"``: appended after the reader had caught up with the WAL.

It is a ``NamedTuple`` on purpose: consumers may unpack it like a record, and it costs
no more than a tuple on the hot path.
"""
from __future__ import annotations

from typing import Final, Literal, NamedTuple

Tier = Literal["cloud", "wal", "live"]

TIER_CLOUD: Final = "cloud"
TIER_WAL: Final = "wal"
TIER_LIVE: Final = "live"
TIERS: Final[tuple[str, ...]] = (TIER_CLOUD, TIER_WAL, TIER_LIVE)

#: A ``native.format.Record`` or any 5-tuple in its order.
RecordTuple = tuple[int, int, "bytes | None", "dict[str, str]", bytes]


class Message(NamedTuple):
    """One message as served to a consumer; ``tier`` says which tier served it."""

    offset: int
    publish_time: int
    key: bytes | None
    attributes: dict[str, str]
    payload: bytes
    tier: str

    @classmethod
    def from_record(cls, record: RecordTuple, tier: str) -> "Message":
        """Wrap a native ``Record`` (or any 5-tuple in record order)."""
        offset, publish_time, key, attributes, payload = record
        return cls(offset, publish_time, key, attributes, payload, tier)


__all__ = ["Message", "Tier", "TIERS", "TIER_CLOUD", "TIER_LIVE", "TIER_WAL"]
