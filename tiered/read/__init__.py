"""The read side: what consumers see.

* ``reader.py`` — :func:`create_reader`: cloud (archived objects) → local WAL → live, with the
  offset asserted contiguous at every handoff.
* ``cloud.py`` — :class:`CloudReader`: footer by one suffix GET, then only the needed blocks.
* ``subscriptions.py`` — cursors in metadata: resume at cursor + 1, batched fenced flushes.
* ``messages.py`` — the :class:`Message` yielded (record fields + the tier that served it).
* ``errors.py`` — typed read/cursor errors (``DataGap`` names the missing range).
"""
from tiered.read.cloud import CloudReader
from tiered.read.errors import CorruptArchive, CursorFenced, DataGap, InvalidAck, ReadError, UnknownOffset
from tiered.read.messages import TIER_CLOUD, TIER_LIVE, TIER_WAL, Message
from tiered.read.reader import TieredReader, create_reader
from tiered.read.subscriptions import Subscription, SubscriptionManager

__all__ = [
    "CloudReader", "CorruptArchive", "CursorFenced", "DataGap", "InvalidAck", "Message", "ReadError",
    "Subscription", "SubscriptionManager", "TIER_CLOUD", "TIER_LIVE", "TIER_WAL", "TieredReader",
    "UnknownOffset", "create_reader",
]
