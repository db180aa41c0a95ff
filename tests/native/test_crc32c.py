"""CRC32C: known vectors, both twins, and the C software fallback against the hardware path."""
from __future__ import annotations

import os

import crc32c as crc32c_pkg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import native

# RFC 3720 (iSCSI) appendix B.4 vectors plus the classic check value.
KNOWN = [
    (b"", 0x00000000),
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


@pytest.mark.parametrize(("data", "expected"), KNOWN)
def test_known_vectors(codec, data, expected):
    assert codec.crc32c(data) == expected


def test_continuation(codec):
    data = os.urandom(5000)
    for cut in (0, 1, 7, 8, 255, 768, 4999, 5000):
        assert codec.crc32c(data[cut:], codec.crc32c(data[:cut])) == codec.crc32c(data)


# Lengths around the 8-byte word and the 3 x 256 / 3 x 8192 interleaved stream boundaries.
EDGE_LENGTHS = [0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 775, 1536, 24575, 24576, 24577, 100_003]


@pytest.mark.parametrize("length", EDGE_LENGTHS)
def test_matches_reference_at_stream_boundaries(codec, length):
    data = os.urandom(length)
    for start in range(8):  # every alignment of the start pointer
        assert codec.crc32c(memoryview(data)[start:]) == crc32c_pkg.crc32c(data[start:])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096), st.integers(0, 2**32 - 1))
def test_twins_and_fallback_agree(data, seed):
    expected = crc32c_pkg.crc32c(data, seed)
    for twin in native.available_codecs():
        assert twin.crc32c(data, seed) == expected
        if twin.IMPLEMENTATION == "cython":
            # The C slicing-by-8 path, which CPUs without SSE4.2 run.
            assert twin.parts["frames"]._crc32c_software(data, seed) == expected


def test_hardware_path_active_when_cpu_has_sse42():
    # The point of the C CRC is speed; on x86 with SSE4.2 it must not silently use the table.
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    for twin in native.available_codecs():
        if twin.IMPLEMENTATION == "cython" and " sse4_2" in flags:
            assert twin.CRC32C_HARDWARE
