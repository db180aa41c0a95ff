"""RealFs appends a round with writev and finishes short writes from the chunks themselves."""
from __future__ import annotations

import os

import pytest

from wal.fs import RealFs


def _short_writev(limit: int, calls: list):
    real = os.writev

    def writev(fd: int, buffers) -> int:
        calls.append([len(b) for b in buffers])
        taken, budget = [], limit
        for buffer in buffers:  # at most ``limit`` bytes per call, as a signal might leave it
            if budget == 0:
                break
            view = memoryview(buffer)[:budget]
            taken.append(view)
            budget -= len(view)
        return real(fd, taken)
    return writev


@pytest.mark.parametrize("limit", [1, 7, 16, 1000])
def test_short_writes_are_finished_in_order_without_joining(tmp_path, monkeypatch, limit):
    chunks = [b"m" * 16, b"", os.urandom(100), b"x" * 3, os.urandom(250)]
    calls: list = []
    monkeypatch.setattr(os, "writev", _short_writev(limit, calls))
    path = str(tmp_path / "seg")
    handle = RealFs().open_append(path)
    handle.write(chunks)
    handle.write([b"tail"])
    handle.close()
    with open(path, "rb") as f:
        assert f.read() == b"".join(chunks) + b"tail"
    total = sum(map(len, chunks))
    assert len(calls) == -(-total // limit) + -(-4 // limit), "each call goes on where the last stopped"
    assert all(sum(call) <= total for call in calls)


def test_a_writev_that_writes_nothing_fails_instead_of_spinning(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "writev", lambda fd, buffers: 0)
    handle = RealFs().open_append(str(tmp_path / "seg"))
    with pytest.raises(OSError, match="wrote nothing"):
        handle.write([b"abc"])
    handle.close()


def _short_pwritev(limit: int, calls: list):
    real = os.pwritev

    def pwritev(fd: int, buffers, position: int) -> int:
        calls.append(position)
        taken, budget = [], limit
        for buffer in buffers:
            if budget == 0:
                break
            view = memoryview(buffer)[:budget]
            taken.append(view)
            budget -= len(view)
        return real(fd, taken, position)
    return pwritev


@pytest.mark.parametrize("limit", [1, 7, 1000])
def test_short_positioned_writes_are_finished_in_place_without_joining(tmp_path, monkeypatch, limit):
    """The journal's positioned writes: a short pwritev goes on at the right position."""
    path = tmp_path / "journal"
    path.write_bytes(b"\0" * 1000)
    chunks = [b"h" * 10, os.urandom(300), b"", b"t" * 5]
    calls: list = []
    monkeypatch.setattr(os, "pwritev", _short_pwritev(limit, calls))
    handle = RealFs().open_rw(str(path))
    handle.pwrite(chunks, 100)
    handle.close()
    data = path.read_bytes()
    assert data[100:415] == b"".join(chunks)
    assert data[:100] == b"\0" * 100 and data[415:] == b"\0" * 585
    assert calls[0] == 100 and len(calls) == -(-315 // limit)
