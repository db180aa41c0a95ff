"""Object store in a local directory (``file:///dir``), the embedded default.

A put never leaves a partial object under its final name: data goes to a temp file
in ``<root>/.dnb-tmp/``, is fsynced, then published with ``rename`` (overwrite) or
``link`` (``if_absent``: link fails if the name exists, so exactly one concurrent
writer wins), and the directory is fsynced so the new name survives a crash.
Temp files left by a crash are ignored by ``list`` and removed by ``sweep_temp``.

ETags are ``<inode>-<size>-<mtime_ns>`` in hex: they change whenever an object is
replaced, without hashing the content.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

from tiered.errors import (
    InvalidKey,
    InvalidRange,
    ObjectNotFound,
    PermissionDenied,
    PreconditionFailed,
    StorageError,
    StorageUnavailable,
)
from tiered.objects.base import (
    DELETE_MANY_MAX,
    ByteRequest,
    Capabilities,
    Data,
    ObjectInfo,
    ObjectStore,
    SuffixByteRequest,
    check_byte_request,
    check_key,
    check_prefix,
)

log = logging.getLogger(__name__)

TMP_DIR_NAME = ".dnb-tmp"
_COPY_CHUNK_BYTES = 8 << 20


class LocalObjectStore(ObjectStore):
    """Objects as files under ``root``. See the module docstring."""

    capabilities = Capabilities(conditional_put=True, atomic_put=True, multipart=False)

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.tmp_dir = os.path.join(self.root, TMP_DIR_NAME)
        with _mapped(self.root):
            os.makedirs(self.tmp_dir, exist_ok=True)
        #: Test hook run after the temp file is durable and before it is published.
        self.before_publish: Callable[[str], None] | None = None

    def _path(self, key: str) -> str:
        check_key(key)
        if key.split("/", 1)[0] == TMP_DIR_NAME:
            raise InvalidKey(f"object key {key!r} uses the reserved {TMP_DIR_NAME} directory")
        path = os.path.join(self.root, *key.split("/"))
        # Belt and braces against symlinks planted inside the root.
        real = os.path.realpath(path)
        if not real.startswith(self.root + os.sep):
            raise InvalidKey(f"object key {key!r} resolves outside the store")
        return path

    # -- writes ------------------------------------------------------------
    def put(self, key: str, data: Data, if_absent: bool = False) -> ObjectInfo:
        path = self._path(key)
        tmp = os.path.join(self.tmp_dir, f"{uuid.uuid4().hex}.tmp")
        with _mapped(key):
            try:
                self._write_temp(tmp, data)
                if self.before_publish is not None:
                    self.before_publish(tmp)
                self._publish(tmp, path, key, if_absent)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            return self._info(key, os.stat(path))

    @staticmethod
    def _write_temp(tmp: str, data: Data) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as out:
            if isinstance(data, (bytes, bytearray, memoryview)):
                out.write(data)
            else:
                with open(os.fspath(data), "rb") as src:
                    while chunk := src.read(_COPY_CHUNK_BYTES):
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())

    def _publish(self, tmp: str, path: str, key: str, if_absent: bool) -> None:
        parent = os.path.dirname(path)
        self._make_dirs(parent)
        if if_absent:
            try:
                os.link(tmp, path)
            except FileExistsError as e:
                raise PreconditionFailed(f"object {key!r} already exists") from e
        else:
            os.replace(tmp, path)
        _fsync_dir(parent)

    def _make_dirs(self, parent: str) -> None:
        """Create missing directories and fsync each new entry's parent."""
        missing = []
        d = parent
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(d)
            _fsync_dir(os.path.dirname(d))

    def delete(self, key: str) -> None:
        path = self._path(key)
        with _mapped(key):
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            _fsync_dir(os.path.dirname(path))

    def delete_many(self, keys: Sequence[str]) -> None:
        """Unlink each key's file, then fsync each directory touched once."""
        if len(keys) > DELETE_MANY_MAX:
            raise ValueError(f"delete_many takes at most {DELETE_MANY_MAX} keys, got {len(keys)}")
        touched: dict[str, str] = {}
        for key in keys:
            path = self._path(key)
            with _mapped(key):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
            touched.setdefault(os.path.dirname(path), key)
        for directory, key in touched.items():
            with _mapped(key):
                _fsync_dir(directory)

    def sweep_temp(self) -> int:
        """Remove temp files left by crashed puts; returns how many. Call at startup only."""
        removed = 0
        for name in os.listdir(self.tmp_dir):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.tmp_dir, name))
                removed += 1
        return removed

    # -- reads -------------------------------------------------------------
    def get(self, key: str) -> bytes:
        path = self._path(key)
        with _mapped(key), _open_regular(path, key) as f:
            return f.read()

    def get_range(self, key: str, byte_range: ByteRequest) -> bytes:
        check_byte_request(byte_range)
        if isinstance(byte_range, SuffixByteRequest):
            return self.get_tail(key, byte_range.suffix)[0]
        start = byte_range.start
        path = self._path(key)
        with _mapped(key), _open_regular(path, key) as f:
            size = os.fstat(f.fileno()).st_size
            if start >= size:
                raise InvalidRange(f"range start {start} is past the end of {key!r} ({size} bytes)")
            f.seek(start)
            return f.read(min(byte_range.end, size) - start)

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]:
        if length < 0:
            raise ValueError(f"suffix length must be >= 0, got {length}")
        path = self._path(key)
        with _mapped(key), _open_regular(path, key) as f:
            size = os.fstat(f.fileno()).st_size
            if length == 0:
                return b"", size
            f.seek(max(0, size - length))
            return f.read(), size

    def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        with _mapped(key):
            st = os.stat(path)
            if not os.path.isfile(path):
                raise ObjectNotFound(f"object {key!r} not found")
            return self._info(key, st)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        # Walk only the deepest directory the prefix pins down.
        base_rel = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = os.path.join(self.root, *base_rel.split("/")) if base_rel else self.root
        keys = []
        for dirpath, dirnames, filenames in os.walk(base):
            if dirpath == self.root:
                dirnames[:] = [d for d in dirnames if d != TMP_DIR_NAME]
            rel_dir = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in filenames:
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        for key in sorted(keys, key=lambda k: k.encode()):
            try:
                yield self.head(key)
            except ObjectNotFound:
                continue  # deleted while listing

    @staticmethod
    def _info(key: str, st: os.stat_result) -> ObjectInfo:
        etag = f"{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"
        return ObjectInfo(key, st.st_size, etag, st.st_mtime)

    def __repr__(self) -> str:
        return f"LocalObjectStore({self.root!r})"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_regular(path: str, key: str) -> BinaryIO:
    """``path`` opened for reading, refused unless it is a regular file: opening a FIFO (or
    a device) put where an object belongs would block a reader forever, not fail it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ObjectNotFound(f"object {key!r} is not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def _mapped(key: str) -> Iterator[None]:
    try:
        yield
    except StorageError:
        raise
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
        raise ObjectNotFound(f"object {key!r} not found") from e
    except PermissionError as e:
        raise PermissionDenied(f"object {key!r}: permission denied") from e
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS):
            raise StorageUnavailable(f"object {key!r}: {os.strerror(e.errno)}") from e
        raise StorageError(f"object {key!r}: {e.strerror}") from e
