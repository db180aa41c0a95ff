"""``FaultFs``: an in-memory twin of ``wal.fs.RealFs`` with a page-cache model and
injectable faults, for tests and crash harnesses (production code never imports it).

A write lands in "memory" and only ``sync()`` (for file data) or ``fsync_dir()`` (for
names: create, rename, remove) makes it durable. ``crash_image()`` returns the file system
a power loss would leave behind: unsynced bytes dropped, with the last write optionally
torn at any byte boundary and the rest of it garbage. ``crash_image_pages()`` /
``random_crash_image()`` model the other way a power loss tears writes: the kernel writes
dirty pages back in any order, so any subset of a file's unsynced pages may have reached
the disk (a later page kept, an earlier one lost, which reads back as zeros), with the
file's size either already extended or not. It can also make fsync fail or stall, and
make every allocating call fail as on a full disk.

Simplification, on purpose: directories themselves are durable as soon as they are made
(the WAL fsyncs the parent anyway); only the names inside them need ``fsync_dir``.
"""
from __future__ import annotations

import errno
import os
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from wal.fs import AppendFile, Chunk, Lock, LockHeld, RandomWriteFile, ReadFile, SyncHandle

#: The page-cache page size the out-of-order crash model persists (or loses) as a unit.
PAGE_BYTES = 4096
_SYNC_HOLD_MAX_S = 30.0



@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    # Lowest byte position changed since the last sync; everything below it is durable.
    dirty_from: int = 0


class _FaultAppendFile:
    def __init__(self, fs: "FaultFs", inode: _Inode) -> None:
        self._fs = fs
        self._inode = inode
        self._closed = False

    def write(self, chunks: Sequence[Chunk]) -> None:
        self._fs._write(self._inode, chunks, self._closed)

    def sync(self) -> None:
        self._fs._sync(self._inode, self._closed)

    def close(self) -> None:
        self._closed = True


class _FaultRandomWriteFile:
    def __init__(self, fs: "FaultFs", inode: _Inode) -> None:
        self._fs = fs
        self._inode = inode
        self._closed = False

    def pwrite(self, chunks: Sequence[Chunk], position: int) -> None:
        self._fs._pwrite(self._inode, chunks, position, self._closed)

    def sync(self) -> None:
        self._fs._sync(self._inode, self._closed)

    def close(self) -> None:
        self._closed = True


class _FaultReadFile:
    def __init__(self, fs: "FaultFs", inode: _Inode) -> None:
        self._fs = fs
        self._inode = inode

    def pread(self, position: int, size: int) -> bytes:
        with self._fs._lock:
            return bytes(self._inode.data[position:position + size])

    def close(self) -> None:
        pass


class _FaultSyncHandle:
    def __init__(self, fs: "FaultFs", volume: str) -> None:
        self._fs = fs
        self._volume = volume
        self._closed = False

    def sync(self) -> None:
        self._fs._sync(None, self._closed, self._volume)

    def close(self) -> None:
        self._closed = True


class _FaultLock:
    def __init__(self, fs: "FaultFs", path: str) -> None:
        self._fs: FaultFs | None = fs
        self._path = path

    def release(self) -> None:
        if self._fs is not None:
            fs, self._fs = self._fs, None
            fs._unlock(self._path)


class FaultFs:
    """In-memory file system with a page-cache model and injectable fsync faults.

    ``fail_sync_after=n`` lets ``n`` file syncs succeed, then every later one raises EIO.
    ``hold_syncs()`` makes syncs block (bounded) until ``release_syncs()``, which freezes
    the WAL with written-but-unsynced bytes so a test can crash it at every byte.
    """

    def __init__(self, fail_sync_after: int | None = None, strict_dirs: bool = False) -> None:
        self._lock = threading.RLock()
        self._dirs: dict[str, dict[str, _Inode]] = {}
        self._durable_dirs: dict[str, dict[str, _Inode]] = {}
        # strict_dirs: a directory made by makedirs is lost in a crash (with everything in it)
        # until its parent is fsynced, like any other name. Off by default (older tests).
        self.strict_dirs = strict_dirs
        self._volatile_dirs: set[str] = set()
        self._last_write: _Inode | None = None
        self.fail_sync_after = fail_sync_after
        self.sync_calls = 0
        self.syncfs_calls = 0  # of sync_calls: those that synced the whole file system
        self.failed_sync_calls = 0
        self._sync_gate = threading.Event()
        self._sync_gate.set()
        self.syncs_waiting = 0
        self._held_locks: set[str] = set()
        #: While True every call that would allocate space (create, write, rename into
        #: a new name, makedirs) fails with ENOSPC, as on a full disk; reads still work.
        self.disk_full = False
        #: Directories standing for other volumes mounted there: a ``syncfs`` of one volume
        #: syncs nothing of another (``open_syncfs``, ``syncfs_covers``).
        self.other_volumes: set[str] = set()
        #: False models a file system whose ``syncfs`` is no flush (FUSE): ``syncfs_covers``
        #: then says no (the ``syncfs`` itself still syncs, as the model has no daemon).
        self.syncfs_flushes = True

    # ---- fault controls
    def hold_syncs(self) -> None:
        self._sync_gate.clear()

    def release_syncs(self) -> None:
        self._sync_gate.set()

    def settle_dirs(self) -> None:
        """Treat every directory made so far as durably named (it existed before the test)."""
        with self._lock:
            self._volatile_dirs.clear()

    def _dir_lost(self, path: str) -> bool:
        while True:
            if path in self._volatile_dirs:
                return True
            parent = os.path.dirname(path)
            if parent == path:
                return False
            path = parent

    def unsynced_bytes(self) -> int:
        """Bytes of the last-written file that a power loss could tear (appended, unsynced)."""
        with self._lock:
            inode = self._last_write
            if inode is None:
                return 0
            return len(inode.data) - min(inode.dirty_from, len(inode.durable))

    def crash_image(self, torn_bytes: int = 0, garbage: bytes = b"") -> "FaultFs":
        """The file system after a power loss now.

        Every file keeps only its synced bytes, except the last one written: it also keeps
        the first ``torn_bytes`` of its unsynced tail, followed by ``garbage`` (what a disk
        may leave when a write is torn). Names not made durable by fsync_dir vanish.
        """
        return self._image(lambda _path, inode: self._crashed_inode(inode, torn_bytes, garbage))

    def process_crash_image(self) -> "FaultFs":
        """The file system after the process died (SIGKILL) while the machine stayed up:
        every name and byte written stays as the page cache holds it, synced or not, and
        no lock is held. A ``crash_image()`` of the result then drops what was never
        synced, as a power loss after the restart would."""
        with self._lock:
            image = FaultFs(strict_dirs=self.strict_dirs)
            image.other_volumes = set(self.other_volumes)
            image.syncfs_flushes = self.syncfs_flushes
            copies: dict[int, _Inode] = {}

            def copy(inode: _Inode) -> _Inode:
                if id(inode) not in copies:
                    copies[id(inode)] = _Inode(bytearray(inode.data), bytes(inode.durable), inode.dirty_from)
                return copies[id(inode)]

            image._dirs = {path: {name: copy(i) for name, i in entries.items()} for path, entries in self._dirs.items()}
            image._durable_dirs = {path: {name: copy(i) for name, i in entries.items()}
                                   for path, entries in self._durable_dirs.items()}
            image._volatile_dirs = set(self._volatile_dirs)
            image._last_write = None if self._last_write is None else copy(self._last_write)
            return image

    def crash_image_pages(self, persist: Callable[[str, list[int]], Iterable[int]],
                          page_bytes: int = PAGE_BYTES, keep_size: bool = True) -> "FaultFs":
        """The file system after a power loss that wrote dirty pages back in any order.

        For every file with unsynced bytes, ``persist(path, pages)`` is given the indexes of
        its dirty pages (page *i* is bytes ``[i * page_bytes, (i + 1) * page_bytes)``), in
        ascending order, and returns those that reached the disk; any subset, in any pattern.
        Unsynced bytes of the other pages read back as zeros (never-written blocks). With
        ``keep_size`` the file keeps the length of everything written (the size update made
        it, some data did not); without, it ends after its last persisted byte (at least at
        its synced length). Synced bytes always survive. Names as in ``crash_image``.
        """
        def crashed(path: str, inode: _Inode) -> _Inode:
            return self._paged_inode(path, inode, persist, page_bytes, keep_size)
        return self._image(crashed)

    def random_crash_image(self, rng: random.Random, page_bytes: int = PAGE_BYTES) -> "FaultFs":
        """``crash_image_pages`` with a random subset of dirty pages persisted (each with a
        random probability per file, so all-lost, all-kept and scattered patterns all occur)
        and a random choice of whether the size was extended."""
        keep_size = rng.random() < 0.5

        def persist(_path: str, pages: list[int]) -> list[int]:
            probability = rng.choice((0.0, 0.25, 0.5, 0.75, 1.0, rng.random()))
            return [page for page in pages if rng.random() < probability]
        return self.crash_image_pages(persist, page_bytes, keep_size)

    def _image(self, crashed: Callable[[str, _Inode], _Inode]) -> "FaultFs":
        with self._lock:
            image = FaultFs(strict_dirs=self.strict_dirs)
            image.other_volumes = set(self.other_volumes)
            image.syncfs_flushes = self.syncfs_flushes
            inodes: dict[int, _Inode] = {}
            for path, entries in self._durable_dirs.items():
                if self._dir_lost(path):
                    continue
                image._dirs[path] = {}
                for name, inode in entries.items():
                    copy = inodes.get(id(inode))
                    if copy is None:
                        copy = inodes[id(inode)] = crashed(os.path.join(path, name), inode)
                    image._dirs[path][name] = copy
                image._durable_dirs[path] = dict(image._dirs[path])
            for path in self._dirs:
                if self._dir_lost(path):
                    continue
                image._dirs.setdefault(path, {})
                image._durable_dirs.setdefault(path, {})
            return image

    def _crashed_inode(self, inode: _Inode, torn_bytes: int, garbage: bytes) -> _Inode:
        base = bytes(inode.durable[:inode.dirty_from])
        # Only a write that was not synced can be torn: a file whose every byte was synced
        # (the temp file of a checkpoint, say, then renamed) keeps exactly those bytes.
        torn = inode is self._last_write and len(inode.data) > inode.dirty_from
        if torn and torn_bytes > 0:
            tail = bytes(inode.data[inode.dirty_from:inode.dirty_from + torn_bytes])
            base += tail + garbage
        elif torn:
            base += garbage
        # An overwrite (pwrite into a file's synced bytes) that did not reach the disk leaves
        # the old bytes there, not a shorter file (appended files have none past dirty_from).
        base += bytes(inode.durable[len(base):])
        return _Inode(bytearray(base), base, len(base))

    @staticmethod
    def _paged_inode(path: str, inode: _Inode, persist: Callable[[str, list[int]], Iterable[int]],
                     page_bytes: int, keep_size: bool) -> _Inode:
        synced = inode.dirty_from  # bytes [0, synced) are durable and equal in data and durable
        size = len(inode.data)
        if size <= synced:
            base = bytes(inode.durable[:synced])
            return _Inode(bytearray(base), base, len(base))
        pages = list(range(synced // page_bytes, (size - 1) // page_bytes + 1))
        kept = sorted(set(persist(path, list(pages))))
        assert set(kept) <= set(pages), f"persist() returned pages that are not dirty: {kept}"
        length = size
        if not keep_size:
            length = max([synced, len(inode.durable)] + [min((page + 1) * page_bytes, size) for page in kept])
        out = bytearray(length)
        # Pages that did not reach the disk read back as what was there before: the old
        # bytes of an overwritten region (a recycled or preallocated file), zeros past them.
        old = inode.durable[:length]
        out[:len(old)] = old
        for page in kept:
            low, high = max(page * page_bytes, synced), min((page + 1) * page_bytes, length)
            out[low:high] = inode.data[low:high]
        base = bytes(out)
        return _Inode(bytearray(base), base, len(base))

    # ---- file system operations
    def _check_space(self, path: str) -> None:
        if self.disk_full:
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)

    def makedirs(self, path: str) -> None:
        with self._lock:
            path = os.path.normpath(path)
            if path not in self._dirs:
                self._check_space(path)
            while path not in self._dirs:
                self._dirs[path] = {}
                self._durable_dirs[path] = {}
                if self.strict_dirs:
                    self._volatile_dirs.add(path)
                parent = os.path.dirname(path)
                if parent == path:
                    break
                path = parent

    def _split(self, path: str) -> tuple[dict[str, _Inode], str]:
        parent, name = os.path.split(os.path.normpath(path))
        entries = self._dirs.get(parent)
        if entries is None:
            raise FileNotFoundError(errno.ENOENT, "no such directory", parent)
        return entries, name

    def _inode(self, path: str) -> _Inode:
        entries, name = self._split(path)
        inode = entries.get(name)
        if inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        return inode

    def listdir(self, path: str) -> list[str]:
        with self._lock:
            path = os.path.normpath(path)
            if path not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            subdirs = [os.path.basename(p) for p in self._dirs if os.path.dirname(p) == path and p != path]
            return sorted(list(self._dirs[path]) + subdirs)

    def exists(self, path: str) -> bool:
        with self._lock:
            path = os.path.normpath(path)
            if path in self._dirs:
                return True
            try:
                self._inode(path)
                return True
            except FileNotFoundError:
                return False

    def file_size(self, path: str) -> int:
        with self._lock:
            return len(self._inode(path).data)

    def read_all(self, path: str) -> bytes:
        with self._lock:
            return bytes(self._inode(path).data)

    def open_append(self, path: str) -> AppendFile:
        with self._lock:
            entries, name = self._split(path)
            if name not in entries:
                self._check_space(path)
            inode = entries.setdefault(name, _Inode())
            return _FaultAppendFile(self, inode)

    def open_read(self, path: str) -> ReadFile:
        with self._lock:
            return _FaultReadFile(self, self._inode(path))

    def open_rw(self, path: str) -> RandomWriteFile:
        with self._lock:
            return _FaultRandomWriteFile(self, self._inode(path))

    def truncate(self, path: str, size: int) -> None:
        with self._lock:
            inode = self._inode(path)
            if size > len(inode.data):
                inode.data += bytes(size - len(inode.data))
            del inode.data[size:]
            inode.dirty_from = min(inode.dirty_from, size)
        self._sync(inode, False)  # RealFs.truncate fsyncs too: counted, and it can fail

    def rename(self, src: str, dst: str) -> None:
        with self._lock:
            src_entries, src_name = self._split(src)
            dst_entries, dst_name = self._split(dst)
            inode = src_entries.pop(src_name, None)
            if inode is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", src)
            dst_entries[dst_name] = inode

    def remove(self, path: str) -> None:
        with self._lock:
            entries, name = self._split(path)
            if entries.pop(name, None) is None:
                raise FileNotFoundError(errno.ENOENT, "no such file", path)

    def rmdir(self, path: str) -> None:
        with self._lock:
            path = os.path.normpath(path)
            if self._dirs.get(path):
                raise OSError(errno.ENOTEMPTY, "directory not empty", path)
            self._dirs.pop(path, None)
            self._durable_dirs.pop(path, None)

    def fsync_dir(self, path: str) -> None:
        with self._lock:
            path = os.path.normpath(path)
            self._durable_dirs[path] = dict(self._dirs[path])
            self._volatile_dirs.difference_update(
                [d for d in self._volatile_dirs if os.path.dirname(d) == path and d != path])

    def open_syncfs(self, path: str) -> SyncHandle:
        """The twin of ``RealFs.open_syncfs``: the handle's ``sync()`` makes every file's
        data and every directory's names of the volume holding ``path`` durable (the whole
        file system but ``other_volumes``), as ``syncfs(2)`` does. It is a file sync like any other for ``fail_sync_after``,
        ``hold_syncs`` and ``sync_calls``."""
        with self._lock:
            if os.path.normpath(path) not in self._dirs:
                raise FileNotFoundError(errno.ENOENT, "no such directory", path)
            return _FaultSyncHandle(self, self._volume(path))

    def syncfs_covers(self, root: str, paths: Sequence[str]) -> bool:
        """The twin of ``RealFs.syncfs_covers``: every path exists and lies on ``root``'s
        volume (``other_volumes``), and ``syncfs_flushes`` (False models a file system
        whose syncfs is no flush, as FUSE's)."""
        with self._lock:
            volume = self._volume(root)
            return self.syncfs_flushes and all(self.exists(p) and self._volume(p) == volume for p in [root, *paths])

    def _volume(self, path: str) -> str:
        """The volume ``path`` lies on: the deepest of ``other_volumes`` holding it, else ""."""
        path = os.path.normpath(path)
        held = [v for v in self.other_volumes if path == v or path.startswith(v.rstrip("/") + "/")]
        return max(held, key=len) if held else ""

    def lock(self, path: str) -> "Lock":
        """The in-memory twin of ``RealFs.lock``: an empty lock file plus a table of held
        paths. Locks are process state, so a ``crash_image`` starts with none held."""
        with self._lock:
            path = os.path.normpath(path)
            if path in self._held_locks:
                raise LockHeld(path)
            entries, name = self._split(path)
            entries.setdefault(name, _Inode())
            self._held_locks.add(path)
            return _FaultLock(self, path)

    def _unlock(self, path: str) -> None:
        with self._lock:
            self._held_locks.discard(path)

    # ---- handle operations
    def _write(self, inode: _Inode, chunks: Sequence[Chunk], closed: bool) -> None:
        if closed:
            raise ValueError("write to a closed file")
        with self._lock:
            self._check_space("<open file>")
            for chunk in chunks:
                inode.data += chunk
            self._last_write = inode

    def _pwrite(self, inode: _Inode, chunks: Sequence[Chunk], position: int, closed: bool) -> None:
        if closed:
            raise ValueError("write to a closed file")
        with self._lock:
            data = b"".join(chunks)
            if position + len(data) > len(inode.data):
                self._check_space("<open file>")
            if position > len(inode.data):
                inode.data += bytes(position - len(inode.data))
            inode.data[position:position + len(data)] = data
            inode.dirty_from = min(inode.dirty_from, position)
            self._last_write = inode

    def _sync(self, inode: _Inode | None, closed: bool, volume: str = "") -> None:
        """Sync one file, or (``inode`` None) every file and name of ``volume`` (``syncfs``)."""
        if closed:
            raise ValueError("sync of a closed file")
        if not self._sync_gate.is_set():
            with self._lock:
                self.syncs_waiting += 1
            self._sync_gate.wait(_SYNC_HOLD_MAX_S)
            with self._lock:
                self.syncs_waiting -= 1
        with self._lock:
            self.sync_calls += 1
            if self.fail_sync_after is not None and self.sync_calls > self.fail_sync_after:
                self.failed_sync_calls += 1
                raise OSError(errno.EIO, "injected fsync failure")
            if inode is not None:
                self._sync_locked(inode)
                return
            self.syncfs_calls += 1
            for path, entries in self._dirs.items():
                if self._volume(path) != volume:
                    continue  # another volume: a syncfs of this one never reaches it
                for entry in entries.values():
                    self._sync_locked(entry)
                self._durable_dirs[path] = dict(entries)
            self._volatile_dirs = {d for d in self._volatile_dirs if self._volume(os.path.dirname(d)) != volume}

    def _sync_locked(self, inode: _Inode) -> None:
        inode.durable = bytes(inode.durable[:inode.dirty_from]) + bytes(inode.data[inode.dirty_from:])
        inode.dirty_from = len(inode.data)
