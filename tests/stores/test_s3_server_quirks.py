"""S3-compatible servers that do not do what S3 does, against moto over HTTP.

The quirks are made real on the wire with botocore ``before-send`` hooks that rewrite the
outgoing request, so moto sees exactly what a server that ignores the header would be
asked: ``If-None-Match`` stripped (older MinIO/Ceph, proxies, s3rver), a suffix range sent
as a prefix range (s3rver answers ``bytes=-N`` with the first N bytes), a range dropped
(the server answers 200 with the whole object), a range shifted.
"""
from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from tiered.errors import PreconditionFailed, StorageError
from tiered.objects import RangeByteRequest, SuffixByteRequest, open_objects
from tiered.objects.s3 import PROBE_KEY_PREFIX

pytestmark = pytest.mark.s3

DATA = bytes(range(256)) * 800  # 200 KiB: over the cloud reader's 64 KiB footer guess


@pytest.fixture
def registry():
    return CollectorRegistry()


@pytest.fixture
def store(moto_server, s3_bucket, registry):
    s = open_objects(f"s3://{s3_bucket}/quirks?endpoint={moto_server.endpoint_url}", metrics_registry=registry)
    yield s
    s.close()


def _on_send(store, operation: str, rewrite) -> None:
    def hook(request, **_kw):
        rewrite(request.headers)
    store._client.meta.events.register(f"before-send.s3.{operation}", hook)


def _strip_if_none_match(headers) -> None:
    if "If-None-Match" in headers:
        del headers["If-None-Match"]


def _range(headers) -> str:
    value = headers.get("Range", "")
    return value.decode() if isinstance(value, bytes) else value


def _suffix_as_prefix(headers) -> None:
    value = _range(headers)
    if value.startswith("bytes=-"):
        headers["Range"] = f"bytes=0-{int(value[len('bytes=-'):]) - 1}"


def _gauge(registry, store) -> float | None:
    return registry.get_sample_value("dnb_object_store_conditional_put_honoured", {"bucket": store.bucket})


def test_probe_finds_an_honest_server_and_cleans_up(store, registry):
    assert store.conditional_put_honoured is None
    store.put("t/a", b"1", if_absent=True)
    assert store.conditional_put_honoured is True and store.capabilities.conditional_put is True
    assert _gauge(registry, store) == 1
    with pytest.raises(PreconditionFailed):
        store.put("t/a", b"2", if_absent=True)
    assert [i.key for i in store.list("")] == ["t/a"]  # the probe key is gone


def test_probe_detects_a_server_ignoring_if_none_match(store, registry, caplog):
    _on_send(store, "PutObject", _strip_if_none_match)
    with caplog.at_level(logging.WARNING, logger="tiered.objects.s3"):
        assert store.capabilities.conditional_put is False
        store.put("t/a", b"1", if_absent=True)
        store.put("t/a", b"2", if_absent=True)  # the server overwrites: exactly what we detected
        assert store.capabilities.conditional_put is False
    assert store.conditional_put_honoured is False and _gauge(registry, store) == 0
    warnings = [r for r in caplog.records if "IGNORES If-None-Match" in r.getMessage()]
    assert len(warnings) == 1  # logged once, not per put
    assert not [i.key for i in store.list(PROBE_KEY_PREFIX)]


def test_a_server_answering_suffix_ranges_with_the_first_bytes_is_worked_around(store, caplog):
    store.put("t/big", DATA)
    _on_send(store, "GetObject", _suffix_as_prefix)
    with caplog.at_level(logging.WARNING, logger="tiered.objects.s3"):
        assert store.get_range("t/big", SuffixByteRequest(16)) == DATA[-16:]
        assert store.get_tail("t/big", 70_000) == (DATA[-70_000:], len(DATA))
        assert store.get_range("t/big", SuffixByteRequest(len(DATA) + 5)) == DATA
    assert len([r for r in caplog.records if "suffix range" in r.getMessage()]) == 1


def test_a_server_ignoring_the_range_is_sliced_locally(store):
    store.put("t/big", DATA)
    _on_send(store, "GetObject", lambda h: h.pop("Range", None))
    assert store.get_range("t/big", RangeByteRequest(1000, 1100)) == DATA[1000:1100]
    assert store.get_tail("t/big", 16) == (DATA[-16:], len(DATA))


def test_a_wrong_range_answer_is_an_error_not_data(store):
    store.put("t/big", DATA)

    def shift(headers) -> None:
        value = _range(headers)
        if value.startswith("bytes=") and not value.startswith("bytes=-"):
            first, last = (int(x) for x in value[len("bytes="):].split("-"))
            headers["Range"] = f"bytes={first + 1}-{last + 1}"
    _on_send(store, "GetObject", shift)
    with pytest.raises(StorageError, match="server answered"):
        store.get_range("t/big", RangeByteRequest(10, 20))
