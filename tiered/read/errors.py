"""Typed errors of the read side: tiered reader, cloud reader and subscriptions.

Every error keeps its cause (``raise ... from e``). Offsets in messages are inclusive.
"""
from __future__ import annotations

from native.errors import DnbError


class ReadError(DnbError):
    """Base class of every error raised by the read side."""


class DataGap(ReadError, LookupError):
    """Offsets ``start..end`` (inclusive) should exist but no tier holds them.

    Raised when the reader reaches the gap, after every message before it was
    served: the reader never skips a range silently.
    """

    def __init__(self, start: int, end: int, detail: str = "") -> None:
        text = f"offsets {start}..{end} are missing"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.start = start
        self.end = end
        self.detail = detail


class CorruptArchive(ReadError):
    """An archived object is damaged or disagrees with its descriptor.

    ``__cause__`` is the native ``CorruptObject`` when the codec found the damage.
    Nothing from the damaged block is served.
    """

    def __init__(self, object_key: str, reason: str) -> None:
        super().__init__(f"archive object {object_key!r}: {reason}")
        self.object_key = object_key
        self.reason = reason


class UnknownOffset(ReadError, LookupError):
    """An offset at or beyond the topic's next offset (it was never written)."""

    def __init__(self, offset: int, next_offset: int, what: str = "offset") -> None:
        super().__init__(f"{what} {offset} does not exist (the topic's next offset is {next_offset})")
        self.offset = offset
        self.next_offset = next_offset


class OffsetOutOfOrder(ReadError):
    """A tier produced an offset at or below one already served (it would be a duplicate)."""

    def __init__(self, expected: int, got: int, tier: str) -> None:
        super().__init__(f"{tier} tier produced offset {got} where {expected} was expected")
        self.expected = expected
        self.got = got
        self.tier = tier


class ReaderClosed(ReadError):
    """The reader was closed; it yields nothing more."""


class TopicMoved(ReaderClosed):
    """The topic stopped being served here (it is being unloaded, moved or was dropped by
    this broker). Every message before ``next_offset`` was served; resume reading at
    ``next_offset`` on the topic's new owner (``BrokerHost.lookup``)."""

    def __init__(self, topic: str, next_offset: int) -> None:
        super().__init__(f"topic {topic} moved away from this broker; resume at offset {next_offset} "
                         "on its new owner")
        self.topic = topic
        self.next_offset = next_offset


class HistoryDiverged(TopicMoved):
    """The topic moved because a failover replaced this broker's history from
    ``next_offset`` on: this broker was fenced, and what this reader served from
    ``next_offset`` up to ``served_until - 1`` (acknowledged only here, never archived) is
    not the topic's history any more (the new owner recorded it as lost). The new owner
    numbers its own messages from ``next_offset``: resume reading there, as after any
    TopicMoved, to get them instead of skipping them."""

    def __init__(self, topic: str, next_offset: int, served_until: int) -> None:
        ReaderClosed.__init__(self, f"topic {topic} was taken over by a new owner, which replaced the history "
                              f"from offset {next_offset} on (this reader had served up to {served_until - 1}); "
                              f"resume at offset {next_offset} on its new owner")
        self.topic = topic
        self.next_offset = next_offset
        self.served_until = served_until


class ReadTimeout(ReadError, TimeoutError):
    """A fetch did not complete within its bound."""


class CursorError(ReadError):
    """Base class of subscription-cursor errors."""


class InvalidAck(CursorError, UnknownOffset):
    """An ack of an offset that does not exist (negative, or >= the topic's next offset)."""

    def __init__(self, subscription: str, offset: int, next_offset: int) -> None:
        UnknownOffset.__init__(self, offset, next_offset, what=f"ack of subscription {subscription!r} at offset")
        self.subscription = subscription


class CursorFenced(CursorError):
    """A cursor write lost its fencing compare: this broker no longer owns the topic.

    Once fenced, the subscription refuses further acks and flushes.
    """

    def __init__(self, subscription: str, cursor: int) -> None:
        super().__init__(
            f"cursor write of subscription {subscription!r} (cursor {cursor}) was fenced: "
            "this broker no longer owns the topic"
        )
        self.subscription = subscription
        self.cursor = cursor


class CursorWriteFailed(CursorError):
    """Writing a cursor failed for a storage reason (see ``__cause__``); retry later."""


class SubscriptionClosed(CursorError):
    """Ack or flush on a closed subscription or manager."""


class TooManySubscriptions(CursorError):
    """A new subscription on a topic that has ``subscriptions_max`` already (each is a
    cursor record kept until it is deleted, and an object while its topic is hosted)."""


__all__ = [
    "CorruptArchive", "CursorError", "CursorFenced", "CursorWriteFailed", "DataGap", "HistoryDiverged", "InvalidAck",
    "OffsetOutOfOrder",
    "ReadError", "ReadTimeout", "ReaderClosed", "SubscriptionClosed", "TooManySubscriptions", "TopicMoved",
    "UnknownOffset",
]  # fmt: skip
