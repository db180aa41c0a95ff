"""Stubs for the compiled twin native/_objects.pyx; same contract as native._protocols.ObjectsTwin."""
from native.format import Record
from native.object_format import Block, Footer, ObjectHeader

_Buffer = bytes | bytearray | memoryview

IMPLEMENTATION: str
__all__ = [  # as in _objects.pyx
    "object_encode", "object_footer_bytes_needed", "object_parse_footer", "object_parse_header",
    "object_decode_block",
]

def object_encode(frames: _Buffer, topic: str, block_bytes: int, zstd_level: int,
                  first_offset: int | None) -> bytes: ...
def object_footer_bytes_needed(tail: _Buffer, object_name: str, object_size: int | None) -> int: ...
def object_parse_footer(tail: _Buffer, object_name: str, object_size: int) -> Footer: ...
def object_parse_header(data: _Buffer, object_name: str) -> ObjectHeader: ...
def object_decode_block(data: _Buffer, block: Block, object_name: str, first_offset: int | None,
                        last_offset: int | None, min_publish_time: int | None,
                        max_publish_time: int | None, want_records: bool) -> list[Record] | bytes: ...
