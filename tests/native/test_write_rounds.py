"""native.write_rounds: many files' commit rounds in one call (one GIL release in the
compiled twin). Both twins: every byte of every file's parts lands in order, a file that
fails reports its own errno and does not stop the others, short writes continue from
where they stopped, and bad arguments are refused before anything is written."""
from __future__ import annotations

import errno
import fcntl
import os

import pytest


def _open(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def test_every_file_gets_its_parts_whole_and_in_order(codec, tmp_path):
    rounds = [[b"marker-0", b"a" * 10, b"", b"b" * 7],
              [],
              [bytes([i % 251]) * (i % 300) for i in range(3000)],  # more parts than IOV_MAX
              [b"z" * (1 << 20)]]
    fds = [_open(str(tmp_path / f"f{i}")) for i in range(len(rounds))]
    try:
        assert codec.write_rounds(fds, rounds) == [0, 0, 0, 0]
        assert codec.write_rounds(fds[:1], [[b"again"]]) == [0]
    finally:
        for fd in fds:
            os.close(fd)
    for i, parts in enumerate(rounds):
        expected = b"".join(parts) + (b"again" if i == 0 else b"")
        assert (tmp_path / f"f{i}").read_bytes() == expected


def test_a_failing_file_reports_its_errno_and_the_others_are_written(codec, tmp_path):
    good = _open(str(tmp_path / "good"))
    full = os.open("/dev/full", os.O_WRONLY)  # every write: ENOSPC, as a full disk
    closed = os.open(os.devnull, os.O_WRONLY)
    os.close(closed)  # EBADF
    try:
        result = codec.write_rounds([full, good, closed, good], [[b"x"], [b"one"], [b"y"], [b"two"]])
    finally:
        os.close(good)
        os.close(full)
    assert result == [errno.ENOSPC, 0, errno.EBADF, 0]
    assert (tmp_path / "good").read_bytes() == b"onetwo"


def test_a_short_write_goes_on_from_where_it_stopped(codec):
    """A non-blocking pipe takes only what fits: what it took must be a prefix of the
    parts, in order, whatever the part boundaries; the rest is reported, not dropped."""
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, fcntl.F_SETFL, fcntl.fcntl(write_end, fcntl.F_GETFL) | os.O_NONBLOCK)
        capacity = fcntl.fcntl(write_end, 1032)  # F_GETPIPE_SZ
        parts = [bytes([i % 256]) * 999 for i in range(2 * capacity // 999 + 2)]
        assert codec.write_rounds([write_end], [parts]) == [errno.EAGAIN]
        fcntl.fcntl(read_end, fcntl.F_SETFL, fcntl.fcntl(read_end, fcntl.F_GETFL) | os.O_NONBLOCK)
        got = b""
        while True:
            try:
                chunk = os.read(read_end, 1 << 16)
            except BlockingIOError:
                break
            got += chunk
        assert len(got) == capacity and got == b"".join(parts)[:capacity]
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("fds, rounds, error", [
    ([1], [], ValueError),
    ([1], [[bytearray(b"x")]], TypeError),
    ([1], [(b"x",)], TypeError),
    ([1, 2], [[b"x"], [memoryview(b"y")]], TypeError),
])
def test_bad_arguments_are_refused_before_anything_is_written(codec, tmp_path, fds, rounds, error):
    fd = _open(str(tmp_path / "f"))
    try:
        with pytest.raises(error):
            codec.write_rounds([fd] * len(fds), rounds)
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == b""
