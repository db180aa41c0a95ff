"""Hypothesis strategies and deterministic sample data shared by the native tests."""
from __future__ import annotations

from hypothesis import strategies as st

U64_MAX = 2**64 - 1

publish_times = st.integers(min_value=0, max_value=U64_MAX)
keys = st.none() | st.binary(max_size=64)
# text() leaves out surrogates by default, so every generated str is encodable as UTF-8.
attributes = st.none() | st.dictionaries(st.text(max_size=12), st.text(max_size=24), max_size=5)
payloads = st.binary(max_size=300)
messages = st.tuples(publish_times, keys, attributes, payloads)
message_lists = st.lists(messages, min_size=1, max_size=40)
offsets = st.integers(min_value=0, max_value=2**63)


def sample_messages(count: int, *, payload_bytes: int = 40, start_ms: int = 1_700_000_000_000):
    """Deterministic messages covering every record shape (no key, empty key, attributes)."""
    out = []
    for i in range(count):
        key = None if i % 3 == 0 else (b"" if i % 3 == 1 else f"key-{i}".encode())
        attrs = None if i % 4 else {"trace": f"t{i}", "région": "é✓"}
        payload = bytes((i * 7 + j) % 251 for j in range(payload_bytes + i % 17))
        out.append((start_ms + i * 3 - (i % 5), key, attrs, payload))
    return out
