"""The ``dnb1`` source's options, parsed and validated once on the planner.

Spark hands options over as strings in a case-insensitive map; everything downstream
works with :class:`ReadOptions` so a typo fails at planning time, not inside a task.
"""
from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from native.errors import DnbError

ON_CORRUPT = ("fail", "skip")
PUSHDOWN = ("auto", "true", "false")
#: One task reads at most this many bytes: a large object's blocks are split into runs of
#: at most this size, and runs of consecutive small objects are packed up to it. Spark's
#: own ``spark.sql.files.maxPartitionBytes`` default.
DEFAULT_PARTITION_BYTES_MAX = 128 * 1024 * 1024
#: What opening one more object (one more GET) costs a task, in bytes, when packing;
#: Spark's ``spark.sql.files.openCostInBytes`` default. Bounds the serial GETs per task
#: (at most 128 MiB / 4 MiB = 32 tiny objects), so packing never trades many tasks for
#: one task making hundreds of sequential requests.
DEFAULT_OPEN_COST_BYTES = 4 * 1024 * 1024
#: Footers are read by this many threads while planning (one suffix GET per object).
DEFAULT_FOOTER_THREADS = 8

KNOWN = {
    "path", "topic", "metadata", "objects", "endpoint", "region", "startingoffset",
    "endingoffset", "startingtimestamp", "endingtimestamp", "oncorrupt", "metricsdir",
    "partitionbytesmax", "opencostbytes", "pushdown", "footerthreads",
}


class OptionError(DnbError, ValueError):
    """An option the source cannot use; the message names the option."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """An inclusive offset window and an inclusive publish-time window (ms)."""

    offset_lo: int = 0
    offset_hi: int | None = None
    time_lo_ms: int | None = None
    time_hi_ms: int | None = None
    #: ``offset IN (...)`` pushed by Spark: only these offsets (None = no such filter).
    offsets_in: frozenset[int] | None = None

    def empty(self) -> bool:
        if self.offset_hi is not None and self.offset_hi < self.offset_lo:
            return True
        if self.time_lo_ms is not None and self.time_hi_ms is not None and self.time_hi_ms < self.time_lo_ms:
            return True
        return self.offsets_in is not None and not self.offsets_in

    def overlaps_offsets(self, first: int, last: int) -> bool:
        if last < self.offset_lo or (self.offset_hi is not None and first > self.offset_hi):
            return False
        if self.offsets_in is not None:
            return any(first <= o <= last for o in self.offsets_in)
        return True

    def overlaps_times(self, min_ms: int, max_ms: int) -> bool:
        if self.time_lo_ms is not None and max_ms < self.time_lo_ms:
            return False
        return not (self.time_hi_ms is not None and min_ms > self.time_hi_ms)

    def tighten(self, **changes: object) -> "Bounds":
        """A copy narrowed by ``changes`` (each bound only ever narrows)."""
        lo = max(self.offset_lo, int(changes.get("offset_lo", self.offset_lo)))  # type: ignore[arg-type]
        hi = _min_opt(self.offset_hi, changes.get("offset_hi"))  # type: ignore[arg-type]
        tlo = _max_opt(self.time_lo_ms, changes.get("time_lo_ms"))  # type: ignore[arg-type]
        thi = _min_opt(self.time_hi_ms, changes.get("time_hi_ms"))  # type: ignore[arg-type]
        ins = self.offsets_in
        new_in = changes.get("offsets_in")
        if new_in is not None:
            ins = frozenset(new_in) if ins is None else ins & frozenset(new_in)  # type: ignore[arg-type]
        return Bounds(lo, hi, tlo, thi, ins)


def _min_opt(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _max_opt(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Validated options. ``objects_url`` is where object keys are resolved."""

    topic: str
    objects_url: str
    metadata_url: str | None
    store_options: dict[str, str] = field(default_factory=dict)
    bounds: Bounds = Bounds()
    on_corrupt: str = "fail"
    metrics_dir: str | None = None
    partition_bytes_max: int = DEFAULT_PARTITION_BYTES_MAX
    open_cost_bytes: int = DEFAULT_OPEN_COST_BYTES
    pushdown: str = "false"
    footer_threads: int = DEFAULT_FOOTER_THREADS
    #: The ``startingOffset`` option as given (None: not given, read from the first
    #: retained offset). By topic, one below the archive start is OffsetBelowRetention.
    starting_offset: int | None = None

    @property
    def by_topic(self) -> bool:
        return self.metadata_url is not None


def parse_options(raw: Mapping[str, str]) -> ReadOptions:
    opts = {str(k).lower(): str(v) for k, v in raw.items()}
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise OptionError(f"unknown dnb1 option(s) {unknown}; known: {sorted(KNOWN)}")
    path = opts.get("path")
    metadata_url = opts.get("metadata")
    if metadata_url:
        if path:
            raise OptionError("give either .load(path) (by location) or option metadata (by topic), not both")
        if "topic" not in opts or "objects" not in opts:
            raise OptionError("reading by topic needs options topic, metadata and objects")
        topic = _topic(opts["topic"])
        objects_url = opts["objects"]
    else:
        location = path or opts.get("objects")
        if not location:
            raise OptionError(
                "say where to read: .load('s3://bucket/prefix/ns/topic' | 'file:///dir') or options "
                "topic + metadata + objects"
            )
        objects_url = _location_url(location)
        topic = _topic(opts["topic"]) if "topic" in opts else _topic_from_location(objects_url)
    on_corrupt = opts.get("oncorrupt", "fail").lower()
    if on_corrupt not in ON_CORRUPT:
        raise OptionError(f"onCorrupt must be one of {ON_CORRUPT}, got {on_corrupt!r}")
    pushdown = opts.get("pushdown", "false").lower()
    if pushdown not in PUSHDOWN:
        raise OptionError(f"pushdown must be one of {PUSHDOWN}, got {pushdown!r}")
    store_options = {k: opts[k] for k in ("endpoint", "region") if k in opts}
    return ReadOptions(
        topic=topic,
        objects_url=objects_url,
        metadata_url=metadata_url or None,
        store_options=store_options,
        bounds=_bounds(opts),
        starting_offset=_offset(opts, "startingoffset"),
        on_corrupt=on_corrupt,
        metrics_dir=opts.get("metricsdir") or None,
        partition_bytes_max=_int_option(opts, "partitionbytesmax", DEFAULT_PARTITION_BYTES_MAX, 1),
        open_cost_bytes=_int_option(opts, "opencostbytes", DEFAULT_OPEN_COST_BYTES, 0),
        pushdown=pushdown,
        footer_threads=_int_option(opts, "footerthreads", DEFAULT_FOOTER_THREADS, 1),
    )


def _topic(text: str) -> str:
    """The canonical ``/ns/topic`` form. Imported here, not at the top: ``wal`` pulls in the
    whole WAL (~150 ms), and every Spark Python worker that unpickles this module (schema
    lookup, each read task's worker) would pay for it without ever parsing a topic."""
    from wal.topics import TopicName

    return str(TopicName.parse(text))


def _location_url(location: str) -> str:
    """A bare absolute path is taken as a local directory."""
    if location.startswith("/"):
        return "file://" + location
    scheme = urllib.parse.urlsplit(location).scheme
    if scheme not in ("file", "s3"):
        raise OptionError(f"location {location!r} must be an s3:// or file:// URL (or an absolute path)")
    return location


def _topic_from_location(url: str) -> str:
    """``.../<ns>/<topic>`` names the topic; anything else is reported by its location."""
    parts = [p for p in urllib.parse.urlsplit(url).path.split("/") if p]
    if len(parts) >= 2:
        try:
            return _topic(f"/{parts[-2]}/{parts[-1]}")
        except ValueError:
            pass
    return url


def _int_option(opts: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    if name not in opts:
        return default
    try:
        value = int(opts[name])
    except ValueError as e:
        raise OptionError(f"option {name} must be an integer, got {opts[name]!r}") from e
    if value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def _offset(opts: Mapping[str, str], name: str) -> int | None:
    if name not in opts:
        return None
    try:
        value = int(opts[name])
    except ValueError as e:
        raise OptionError(f"option {name} must be an integer offset, got {opts[name]!r}") from e
    if value < 0:
        raise OptionError(f"option {name} must be >= 0, got {value}")
    return value


def parse_timestamp_ms(text: str, round_up: bool = False) -> int:
    """Milliseconds since the epoch, or an ISO-8601 time (naive = UTC). A time between two
    milliseconds is rounded down, or up with ``round_up`` (an inclusive lower bound: a
    message published before the bound must not pass it, atk60 f03)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise OptionError(f"timestamp {text!r} is neither epoch milliseconds nor ISO-8601") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    ms = datetime_to_ms(moment)
    return ms + 1 if round_up and moment.microsecond % 1000 else ms


def datetime_to_ms(moment: dt.datetime) -> int:
    """Exact ms for an aware datetime; a naive one is read as UTC (the session zone)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    delta = moment - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _bounds(opts: Mapping[str, str]) -> Bounds:
    lo = _offset(opts, "startingoffset")
    hi = _offset(opts, "endingoffset")
    tlo = parse_timestamp_ms(opts["startingtimestamp"], round_up=True) if "startingtimestamp" in opts else None
    thi = parse_timestamp_ms(opts["endingtimestamp"]) if "endingtimestamp" in opts else None
    return Bounds(offset_lo=lo or 0, offset_hi=hi, time_lo_ms=tlo, time_hi_ms=thi)
