"""The file layer the WAL does all its I/O through: the ``FileSystem`` protocol and
``RealFs``, which maps straight onto ``os`` calls.

Its fault-injecting in-memory twin, ``FaultFs`` (page-cache model, power-loss images,
failing or stalled fsyncs), is a test double and lives in ``wal.testing.faultfs``.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import re
import sys
from collections.abc import Sequence
from typing import Protocol

from wal.errors import WalError

#: Name of the lock file a WAL directory (and a broker's WAL root) holds while open. The
#: leading dot keeps it apart from every topic/namespace name (those may not start with
#: a dot) and from segment and checkpoint files.
LOCK_NAME = ".lock"


def crash_safe_order(names: "list[str]") -> "list[str]":
    """The order to remove or move a WAL directory's files so a crash at any point leaves
    a log that still opens with the same tip: the checkpoint first (so no checkpoint can
    name a segment that is gone), then segments oldest first (what is left is a suffix,
    as after retention), bookkeeping dot files (``.owner``) last, the lock file never
    (it is not data; the caller removes it)."""
    return sorted((n for n in names if n != LOCK_NAME),
                  key=lambda n: (n != "wal.ckpt", n.startswith("."), n))
_IOV_MAX = 1024  # Linux IOV_MAX; writev with more buffers fails with EINVAL.


#: What the write calls accept: bytes, or views into them (the journal writes segment bytes
#: straight from a replayed journal file).
Chunk = bytes | memoryview


class AppendFile(Protocol):
    def write(self, chunks: Sequence[Chunk]) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


class RandomWriteFile(Protocol):
    """A file written at given positions (the shared journal's preallocated files)."""

    def pwrite(self, chunks: Sequence[Chunk], position: int) -> None: ...
    def sync(self) -> None: ...
    def close(self) -> None: ...


class ReadFile(Protocol):
    def pread(self, position: int, size: int) -> bytes: ...
    def close(self) -> None: ...


class FileSystem(Protocol):
    def makedirs(self, path: str) -> None: ...
    def listdir(self, path: str) -> list[str]: ...
    def exists(self, path: str) -> bool: ...
    def file_size(self, path: str) -> int: ...
    def read_all(self, path: str) -> bytes: ...
    def open_append(self, path: str) -> AppendFile: ...
    def open_read(self, path: str) -> ReadFile: ...
    def open_rw(self, path: str) -> RandomWriteFile: ...
    def truncate(self, path: str, size: int) -> None: ...
    def rename(self, src: str, dst: str) -> None: ...
    def remove(self, path: str) -> None: ...
    def rmdir(self, path: str) -> None: ...
    def fsync_dir(self, path: str) -> None: ...
    def open_syncfs(self, path: str) -> "SyncHandle": ...
    def syncfs_covers(self, root: str, paths: Sequence[str]) -> bool: ...
    def lock(self, path: str) -> "Lock": ...


class Lock(Protocol):
    def release(self) -> None: ...


class SyncHandle(Protocol):
    def sync(self) -> None: ...
    def close(self) -> None: ...


# --------------------------------------------------------------------------- real files

class _RealWritable:
    """A descriptor written through: fdatasync and an idempotent close."""

    _fd: int

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _RealAppendFile(_RealWritable):
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def hold(self) -> int:
        """The descriptor, for a write by descriptor (``native.write_rounds``) made by the
        only thread that writes or closes this file; ``let_go`` after it. -1 once closed."""
        return self._fd

    def let_go(self) -> None:
        """Nothing to release (see ``hold``)."""

    def write(self, chunks: Sequence[Chunk]) -> None:
        """Writes every chunk, in order; one syscall per 1,024 chunks, no joining copy."""
        if len(chunks) <= _IOV_MAX:
            _writev_all(self._fd, chunks)
            return
        for start in range(0, len(chunks), _IOV_MAX):
            _writev_all(self._fd, chunks[start:start + _IOV_MAX])


def _writev_all(fd: int, chunks: Sequence[Chunk]) -> None:
    """writev until every byte is out: a short write (e.g. a signal) must not lose data. The
    rest goes out from the chunks themselves: joining them would copy the whole round."""
    pending = chunks
    remaining = sum(map(len, chunks))
    while remaining:
        written = os.writev(fd, pending)
        if written <= 0:  # a regular file never does this; never spin on it
            raise OSError(errno.EIO, f"writev wrote nothing with {remaining} bytes to go")
        remaining -= written
        if remaining:
            pending = _unwritten(pending, written)


def _unwritten(chunks: Sequence[Chunk], written: int) -> list[Chunk]:
    """What a short vectored write of ``chunks`` left after ``written`` bytes: the rest of
    the buffers, the first one as a view (no copy)."""
    index = 0
    while written >= len(chunks[index]):  # skip the buffers written whole
        written -= len(chunks[index])
        index += 1
    return [memoryview(chunks[index])[written:], *chunks[index + 1:]]


class _RealRandomWriteFile(_RealWritable):
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def pwrite(self, chunks: Sequence[Chunk], position: int) -> None:
        """Writes the chunks back to back from ``position``; one syscall per 1,024 chunks."""
        for start in range(0, len(chunks), _IOV_MAX):
            part: Sequence[Chunk] = chunks[start:start + _IOV_MAX]
            remaining = sum(map(len, part))
            while remaining:
                written = os.pwritev(self._fd, part, position)
                if written <= 0:  # a regular file never does this; never spin on it
                    raise OSError(errno.EIO, f"pwritev wrote nothing with {remaining} bytes to go")
                position += written
                remaining -= written
                if remaining:  # a short write: go on from the chunks, not a joined copy
                    part = _unwritten(part, written)


class _RealReadFile:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def pread(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RealFs:
    """The operating system's file system."""

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def file_size(self, path: str) -> int:
        return os.stat(path).st_size

    def read_all(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def open_append(self, path: str) -> AppendFile:
        return _RealAppendFile(path)

    def open_read(self, path: str) -> ReadFile:
        return _RealReadFile(path)

    def open_rw(self, path: str) -> RandomWriteFile:
        """An existing file, for writes at positions (``pwritev``) and ``fdatasync``."""
        return _RealRandomWriteFile(path)

    def truncate(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)  # the repair must be durable before we append after it
        finally:
            os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def open_syncfs(self, path: str) -> "SyncHandle":
        """A handle whose ``sync()`` is ``syncfs(2)`` on the file system holding ``path``:
        every dirty file (data and metadata) and every directory entry of that file system
        is durable when it returns. One call makes a whole commit round of many files
        durable (``wal.group``). It cannot say WHICH file failed.

        Keep the handle open for as long as its syncs vouch for writes: the kernel reports
        a write-back error to a ``syncfs`` only if it happened after the descriptor was
        opened (Linux >= 5.8, ``errseq``; >= 5.17 for the file system's own errors:
        ``syncfs_reports_errors``), so a descriptor opened per call could miss an
        error of a background write-back that came before it.
        """
        return _RealSyncHandle(path)

    def syncfs_covers(self, root: str, paths: Sequence[str]) -> bool:
        """Whether one ``syncfs`` through ``open_syncfs(root)`` makes every one of ``paths``
        durable (data and names): each lies on the file system holding ``root`` (the same
        device, symlinks followed), that file system is one whose ``syncfs`` flushes to
        stable storage (``SYNCFS_FLUSHES``), and this kernel's ``syncfs`` reports write-back
        errors. Not, for instance, a WAL directory on another volume mounted under the
        root (a ``syncfs`` of the root never touches it), or FUSE, whose ``syncfs`` only
        writes dirty pages to the daemon, never asking it to persist them (``fdatasync``
        does). False when a path cannot be examined."""
        if not syncfs_reports_errors():
            return False
        try:
            device = os.stat(root).st_dev
            if statfs_type(root) not in SYNCFS_FLUSHES:
                return False
            return all(os.stat(path).st_dev == device for path in paths)
        except OSError:
            return False

    def lock(self, path: str) -> "Lock":
        """Take an exclusive ``flock`` on ``path`` (created if absent), without waiting.

        Held until ``release()``; the kernel drops it when the process dies, so a crash
        never leaves a directory locked. flock locks belong to the open file description:
        a second ``lock`` of the same path in the same process is refused too."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            os.close(fd)
            raise LockHeld(path) from e
        except BaseException:
            os.close(fd)
            raise
        return _RealLock(fd)


class _RealSyncHandle:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def sync(self) -> None:
        syncfs(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_libc: "ctypes.CDLL | None" = None


def syncfs(fd: int) -> None:
    """``syncfs(2)`` (Python's ``os`` has none): raises OSError with the call's errno."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.syncfs(ctypes.c_int(fd)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


#: File systems (``statfs`` magic numbers, linux/magic.h) whose ``syncfs`` writes every
#: dirty file back and flushes the device's cache (their ``sync_fs``): ext2/3/4, XFS,
#: Btrfs, F2FS. tmpfs too: nothing on it survives a power loss, synced or not, so a
#: ``syncfs`` there loses nothing an ``fdatasync`` would keep. Anything else (FUSE, NFS,
#: overlayfs, ...) is not relied on: each file is synced on its own.
SYNCFS_FLUSHES = frozenset({0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x01021994})


def statfs_type(path: str) -> int:
    """``statfs(2)``'s ``f_type`` of the file system holding ``path``; OSError if it fails."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _libc.statfs(os.fsencode(path), buffer) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return ctypes.c_long.from_buffer(buffer).value & 0xFFFFFFFF


def syncfs_reports_errors() -> bool:
    """Whether this kernel's ``syncfs(2)`` returns every error a sync of each file would
    (Linux 5.17 and later). Before 5.8 it returned 0 even when writing a file back failed;
    from 5.8 it reports write-back errors (``errseq``), but until 5.17 it dropped the file
    system's own ``sync_fs`` errors (a failed cache flush, a failed log write), which an
    ``fdatasync`` reports (atk80 F2). Either way a commit group, or a checkpoint, could
    have vouched for data that never reached stable storage."""
    if sys.platform != "linux":
        return False
    match = re.match(r"(\d+)\.(\d+)", platform.release())
    return match is not None and (int(match.group(1)), int(match.group(2))) >= SYNCFS_KERNEL_MIN


#: The first Linux release whose ``syncfs`` reports what an ``fdatasync`` of each file would
#: (``syncfs_reports_errors``).
SYNCFS_KERNEL_MIN = (5, 17)


class LockHeld(WalError, OSError):
    """``FileSystem.lock`` found the lock taken (the WAL turns it into ``WalLocked``)."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EWOULDBLOCK, "lock held by another opener", path)


class _RealLock:
    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor drops the flock


def directory_key(fs: FileSystem, path: str) -> str:
    """One name per directory however it is spelled (symlinks, "..", relative paths): the
    real path on the real file system, the normalised one on a file layer without links."""
    return os.path.realpath(path) if isinstance(fs, RealFs) else os.path.normpath(path)
