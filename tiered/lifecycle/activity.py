"""What clients do with one hosted topic, for the broker's load report.

* **Bytes in and out**: every message appended to the topic adds its payload and key
  length (:meth:`TopicActivity.received`, called by :class:`HostedTopic` once the WAL
  took the append), and every message a reader of the topic hands out adds the same
  (:meth:`TopicActivity.served`, called by the tiered reader); cumulative counters, so
  the reporter's rate is the change between two reports. Counted here, per hosted
  topic, rather than read from the WAL's ``dnb_wal_append_bytes`` series: that series
  is one aggregate for every topic when ``broker.metrics_per_topic`` is off, and it
  grows only when the WAL writer has synced, so a report would depend on its timing.
* **Connections**: the client connections that produced to or read from the topic
  since the last sample (:meth:`TopicActivity.take_connections`). The broker process
  names a connection by its peer address and port (one HTTP keep-alive connection);
  an in-process caller passes whatever identifies its client, or nothing.

Counting never blocks the hot path for long (one short lock per call) and never
fails: a load number is an input to placement, not part of any guarantee.
"""
from __future__ import annotations

import threading
from collections.abc import Hashable


class TopicActivity:
    """Thread-safe counters of one hosted topic (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes_in = 0
        self._bytes_out = 0
        self._producers: set[Hashable] = set()
        self._consumers: set[Hashable] = set()

    def received(self, nbytes: int) -> None:
        """Messages of ``nbytes`` in all (payloads + keys) were appended to the topic."""
        with self._lock:
            self._bytes_in += nbytes

    def served(self, nbytes: int) -> None:
        """A reader handed out one message of ``nbytes`` (payload + key)."""
        with self._lock:
            self._bytes_out += nbytes

    def produced_by(self, client: Hashable) -> None:
        with self._lock:
            self._producers.add(client)

    def read_by(self, client: Hashable) -> None:
        with self._lock:
            self._consumers.add(client)

    @property
    def bytes_in(self) -> int:
        """Bytes appended to the topic so far (never decreases)."""
        with self._lock:
            return self._bytes_in

    @property
    def bytes_out(self) -> int:
        """Bytes handed out to readers so far (never decreases)."""
        with self._lock:
            return self._bytes_out

    def take_connections(self) -> tuple[int, int]:
        """(producer, consumer) connections seen since the last call; starts a new sample."""
        with self._lock:
            counts = len(self._producers), len(self._consumers)
            self._producers, self._consumers = set(), set()
        return counts
