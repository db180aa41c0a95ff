"""The contract both codec twins satisfy (``native._codec_py`` and the compiled ``native._codec``).

A type checker checks each twin against :class:`CodecTwin`; ``tests/native`` checks at run
time that both expose every name. Signatures mirror ``native/_codec.pyi``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from native.format import Record, ScanResult
from native.object_format import Block, Footer, ObjectHeader

Buffer = bytes | bytearray | memoryview
Message = tuple[int, "bytes | None", "Mapping[str, str] | None", bytes]


class AppendCore(Protocol):
    """The WAL append core (``AppendBuffer`` in each twin); see its docstring in _codec.pyx.

    Construct with ``AppendBuffer(next_offset, *, max_message_bytes, pending_bytes_max,
    batch_bytes, tail_messages_max, tail_bytes_max, wake, wait_for_room, too_large,
    normalize)``.
    """

    max_message_bytes: int
    pending_bytes_max: int
    batch_bytes: int
    refusal: Callable[[], BaseException] | None

    def append(self, payload: bytes, key: bytes | None = None,
               attributes: Mapping[str, str] | None = None, publish_time: int | None = None) -> int: ...
    def append_batch(self, messages: Sequence, publish_time: int | None = None) -> int: ...
    def take(self) -> tuple[list[bytes], int, int, int, int, int]: ...
    def park(self) -> bool: ...
    def unpark(self) -> None: ...
    @property
    def next_offset(self) -> int: ...
    @property
    def pending_first(self) -> int: ...
    @property
    def pending_count(self) -> int: ...
    @property
    def pending_bytes(self) -> int: ...
    @property
    def writer_idle(self) -> bool: ...
    @property
    def busy(self) -> bool: ...


@runtime_checkable
class CodecTwin(Protocol):
    IMPLEMENTATION: str

    def crc32c(self, data: Buffer, value: int = 0) -> int: ...
    def encode_record(self, publish_time: int, key: bytes | None,
                      attributes: Mapping[str, str] | None, payload: bytes) -> bytes: ...
    def encode_frame(self, offset: int, publish_time: int, key: bytes | None,
                     attributes: Mapping[str, str] | None, payload: bytes) -> bytes: ...
    def encode_batch(self, first_offset: int, messages: Iterable[Message]) -> bytes: ...
    def decode_record(self, offset: int, record: Buffer) -> Record: ...
    def scan_frames(self, buf: Buffer, pos: int = 0, end: int | None = None,
                    expected_offset: int | None = None, decode: bool = True,
                    positions: bool = False, max_frames: int | None = None,
                    rounds: bool = False) -> ScanResult: ...
    def encode_segment_header(self, base_offset: int, created_ms: int, version: int = ...) -> bytes: ...
    def encode_round_marker(self, first_offset: int) -> bytes: ...
    def decode_segment_header(self, buf: Buffer) -> tuple[int, int]: ...
    AppendBuffer: Callable[..., AppendCore]

    # dnb1 objects: the primitives behind native.object_format (use that module's API).
    def object_encode(self, frames: Buffer, topic: str, block_bytes: int, zstd_level: int,
                      first_offset: int | None) -> bytes: ...
    def object_footer_bytes_needed(self, tail: Buffer, object_name: str,
                                   object_size: int | None) -> int: ...
    def object_parse_footer(self, tail: Buffer, object_name: str, object_size: int) -> Footer: ...
    def object_parse_header(self, data: Buffer, object_name: str) -> ObjectHeader: ...
    def object_decode_block(self, data: Buffer, block: Block, object_name: str,
                            first_offset: int | None, last_offset: int | None,
                            min_publish_time: int | None, max_publish_time: int | None,
                            want_records: bool) -> list[Record] | bytes: ...


TWIN_NAMES = (
    "IMPLEMENTATION", "crc32c", "encode_record", "encode_frame", "encode_batch", "decode_record",
    "scan_frames", "encode_segment_header", "decode_segment_header", "encode_round_marker", "AppendBuffer",
    "object_encode",
    "object_footer_bytes_needed", "object_parse_footer", "object_parse_header",
    "object_decode_block",
)
