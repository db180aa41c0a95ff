"""One broker's WAL root on disk: who it belongs to and what each WAL in it is.

* ``<root>/.lock`` — held while a host uses the root: one host per root, whatever its
  broker id (the kernel drops it if the process dies, so a restart is never refused).
* ``<root>/.broker`` — the broker id that first used the root; another id is refused
  (:class:`~tiered.lifecycle.errors.WalRootOwnedByAnotherBroker`).
* ``<root>/<namespace>/<topic>/.owner`` — which of this broker's epochs last opened
  that WAL (the owner record alone cannot tell: a load that fails keeps ownership and
  bumps the epoch without touching the WAL, and a takeover from us may have happened
  in between).

Markers are small checksummed JSON files written durably (temp, fsync, rename, fsync
dir). Every lookup goes through the WAL's own file layer: a WAL on a fault-injecting
(or any non-OS) file system does not exist on the real disk.
"""
from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Mapping

from crc32c import crc32c
from prometheus_client import CollectorRegistry

from tiered.lifecycle.errors import LoadError, LocalWalUnreadable, WalRootOwnedByAnotherBroker
from tiered.lifecycle.ownership import OwnerToken
from wal import WriteAheadLog
from wal.api import WalOffsets
from wal.config import GroupSync, WalConfig
from native.errors import CodecError
from wal.errors import CorruptLog, WalFailed, WalLocked, WalTimeout
from wal.fs import LOCK_NAME, FileSystem, LockHeld, RealFs
from wal.budget import MemoryBudgets
from wal.group import CommitGroup
from wal.identity import read_wal_id
from wal.journal import JournalConfig
from wal.metrics import GroupMetrics
from wal.topics import TopicName

_log = logging.getLogger(__name__)

#: In a local WAL directory: which of this broker's epochs last opened the WAL.
OWNER_MARKER = ".owner"
#: In a WAL root: the broker id that first used it.
ROOT_IDENTITY = ".broker"

#: Errors of the environment, not of the WAL's files: disk full, quota, read-only,
#: permissions, out of descriptors (process or system), file size limit, out of memory,
#: and a network file system's stale handle, timeout, lock or busy resource.
_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                                 errno.EMFILE, errno.ENFILE, errno.EFBIG, errno.ENOMEM,
                                 errno.ESTALE, errno.ETIMEDOUT, errno.ENOLCK, errno.EBUSY, errno.EAGAIN})


class WalRoot:
    """The WAL root of one broker id, locked and claimed for it while this object lives
    (until :meth:`release`)."""

    def __init__(self, broker_id: str, wal_root: str, wal_fs: FileSystem | None, wal_config: WalConfig,
                 metrics_registry: CollectorRegistry | None = None) -> None:
        """``wal_fs`` is the file layer every WAL of this root runs on (``wal.fs``; the
        real disk when None); ``wal_config`` the configuration WALs are opened with and
        ``metrics_registry`` the registry they count into (a private one each when None)."""
        self.broker_id = broker_id
        self.wal_root = wal_root
        self.wal_fs = wal_fs
        self.wal_config = wal_config
        self.metrics_registry = metrics_registry
        #: Every lookup of the WAL root goes through the WAL's own file layer: a WAL on
        #: a fault-injecting (or any non-OS) file system does not exist on the real disk.
        self.fs: FileSystem = wal_fs if wal_fs is not None else RealFs()
        # One host per WAL root: a second process with the same root (whatever its broker
        # id) would recover, retire or append to the same WALs. Held until release(); the
        # kernel drops it if the process dies, so a restart after a crash is never refused.
        self.fs.makedirs(self.wal_root)
        try:
            self._root_lock = self.fs.lock(os.path.join(self.wal_root, LOCK_NAME))
        except LockHeld as e:
            raise WalLocked(self.wal_root, "another broker host uses this WAL root") from e
        try:
            self.claim()
            #: The commit group every WAL of this root joins (None: one writer per WAL).
            self.group: CommitGroup | None = self._commit_group()
            #: The memory bounds every WAL of the root shares: the group's, or, with one
            #: writer per WAL, the root's own (wal/budget.py), so thousands of topics
            #: cannot hold gigabytes appended or cached on either path.
            self.budgets: MemoryBudgets = self.group.budgets if self.group is not None else MemoryBudgets(
                self.wal_root, wal_config.cache_group_bytes_max, wal_config.pending_group_bytes_max,
                GroupMetrics(metrics_registry), single_adder=False)
        except BaseException:
            self._root_lock.release()
            raise

    def _commit_group(self) -> CommitGroup | None:
        config = self.wal_config
        if not config.commit_group:
            return None  # each WAL replays the root's journal, if it has one, when it opens
        if config.group_sync == GroupSync.JOURNAL:
            # Replays what the last run left in the journal before any WAL of the root opens.
            return CommitGroup(self.wal_root, self.fs, journal=JournalConfig(
                file_bytes=config.journal_file_bytes, checkpoint_bytes=config.journal_checkpoint_bytes,
                checkpoint_interval_s=config.journal_checkpoint_interval_s, files_max=config.journal_files_max,
                syncfs_min_files=config.journal_checkpoint_syncfs_min_files),
                metrics_registry=self.metrics_registry, cache_bytes_max=config.cache_group_bytes_max,
                pending_bytes_max=config.pending_group_bytes_max)
        if not self.fs.syncfs_covers(self.wal_root, [self.wal_root]):
            # Before Linux 5.17 syncfs could return success when write-back or the file
            # system's own flush failed (wal.fs.syncfs_reports_errors), and on
            # some file systems (FUSE) it is no flush at all: a group could acknowledge lost
            # data. Per-topic fdatasync reports its file's errors and reaches any file system.
            _log.warning("WAL root %s: a syncfs here does not make every file durable (a kernel before 5.17, "
                         "or a file system whose syncfs is no flush); using one writer and fdatasync per "
                         "topic instead of a commit group", self.wal_root)
            return None
        return CommitGroup(self.wal_root, self.fs, metrics_registry=self.metrics_registry,
                           cache_bytes_max=config.cache_group_bytes_max,
                           pending_bytes_max=config.pending_group_bytes_max)

    def release(self) -> None:
        """Stop the commit group (every WAL of the root must be closed by now) and let go
        of the root's lock (another host may use the root from now on)."""
        try:
            if self.group is not None:
                self.group.close(self.wal_config.close_timeout_s)
            else:
                self.budgets.close()
        except WalTimeout as e:
            # A WAL still in the group may still write: its own directory lock keeps any
            # new opener of it out until this process ends.
            _log.error("WAL root %s: %s", self.wal_root, e)
        finally:
            self._root_lock.release()

    def claim(self) -> None:
        """Write ``<root>/.broker`` (this broker id) on first use; refuse another id."""
        path = os.path.join(self.wal_root, ROOT_IDENTITY)
        if self.fs.exists(path):
            found = decode_marker(self.fs.read_all(path))
            found_id = found.get("broker_id") if found is not None else None
            if found_id == self.broker_id:
                return
            raise WalRootOwnedByAnotherBroker(self.wal_root, str(found_id if found_id else "<unreadable>"),
                                              self.broker_id)
        # No identity yet (a new root, or one from before identities): its WALs' own
        # .owner markers say whose they are. Claiming another broker's WALs would retire
        # them as stale.
        for other in self.marker_broker_ids():
            if other != self.broker_id:
                raise WalRootOwnedByAnotherBroker(self.wal_root, other, self.broker_id)
        self.write_marker(path, {"broker_id": self.broker_id})

    def marker_broker_ids(self) -> set[str]:
        """Broker ids named by the (valid) .owner markers of the WALs under the root."""
        found: set[str] = set()
        for namespace in self.fs.listdir(self.wal_root):
            if namespace.startswith("."):
                continue
            try:
                names = self.fs.listdir(os.path.join(self.wal_root, namespace))
            except (NotADirectoryError, FileNotFoundError):
                continue
            for name in names:
                marker = os.path.join(self.wal_root, namespace, name, OWNER_MARKER)
                try:
                    body = decode_marker(self.fs.read_all(marker)) if self.fs.exists(marker) else None
                except OSError:
                    body = None
                broker_id = body.get("broker_id") if body is not None else None
                if isinstance(broker_id, str):
                    found.add(broker_id)
        return found

    def write_marker(self, path: str, body: Mapping[str, object]) -> None:
        """Durably write a small checksummed JSON marker (temp, fsync, rename, fsync dir)."""
        temp = path + ".tmp"
        handle = self.fs.open_append(temp)
        try:
            handle.write([encode_marker(body)])
            handle.sync()
        finally:
            handle.close()
        self.fs.rename(temp, path)
        self.fs.fsync_dir(os.path.dirname(path))

    # -- one topic's WAL ---------------------------------------------------------------
    def path(self, topic: TopicName) -> str:
        """``<root>/<namespace>/<topic>``: where this broker keeps the topic's WAL."""
        return os.path.join(self.wal_root, topic.namespace, topic.name)

    def exists(self, topic: TopicName) -> bool:
        """Whether this broker has a WAL of ``topic`` holding any file besides bookkeeping."""
        path = self.path(topic)
        # Dot files (.lock, .owner) are the host's and the WAL's bookkeeping, not data.
        try:
            return self.fs.exists(path) and any(not n.startswith(".") for n in self.fs.listdir(path))
        except NotADirectoryError:
            return False  # a file named like the topic (an operator's backup): not a WAL

    def owner_marker_path(self, topic: TopicName) -> str:
        return os.path.join(self.path(topic), OWNER_MARKER)

    def _own_marker(self, topic: TopicName) -> dict[str, object] | None:
        """This broker's ``.owner`` marker of ``topic``, or None (absent, unreadable, damaged
        (checksum), or another broker's: unknown, the owner record decides, as before markers)."""
        path = self.owner_marker_path(topic)
        try:
            if not self.fs.exists(path):
                return None
            body = decode_marker(self.fs.read_all(path))
        except OSError:
            return None
        return body if body is not None and body.get("broker_id") == self.broker_id else None

    def read_wal_id(self, topic: TopicName) -> bytes | None:
        """The id (``.walid``) of this broker's WAL of ``topic``; None without a WAL here, or
        when the file does not read (``wal.identity``)."""
        return read_wal_id(self.fs, self.path(topic))

    def read_owner_marker(self, topic: TopicName) -> int | None:
        """The epoch of this broker that last opened its WAL of ``topic`` (None: unknown)."""
        body = self._own_marker(topic)
        epoch = None if body is None else body.get("epoch")
        return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None

    def read_owner_marker_missing(self, topic: TopicName) -> tuple[str, int] | None:
        """The history of this broker this WAL does NOT hold although it was opened after
        it: ``(broker_id, epoch)`` of the own epoch before the one that created it empty
        (its reload found no WAL of it here, e.g. another data dir), until some load records
        that history's loss (see ``write_owner_marker``). None: none, or unknown."""
        body = self._own_marker(topic)
        missing = None if body is None else body.get("missing")
        if (isinstance(missing, list) and len(missing) == 2 and isinstance(missing[0], str)
                and isinstance(missing[1], int) and not isinstance(missing[1], bool)):
            return missing[0], missing[1]
        return None

    def write_owner_marker(self, token: OwnerToken, missing: tuple[str, int] | None = None) -> None:
        """Durably record that ``token``'s epoch has this WAL open (temp, fsync, rename).

        ``missing``: an own earlier history this WAL does not hold (it was created empty
        after it). The load that created it records that history's loss when it marks
        the topic open; should it fail or die before, a later load that recovers this WAL
        still knows to record it, instead of taking the WAL as that history's."""
        body: dict[str, object] = {"broker_id": self.broker_id, "epoch": token.epoch}
        if missing is not None:
            body["missing"] = [missing[0], missing[1]]
        self.write_marker(self.owner_marker_path(token.topic), body)

    def open_wal(self, topic: TopicName, initial_offset: int | None = None) -> WriteAheadLog:
        """Open (or create) the WAL of ``topic`` under this root, in the root's commit group."""
        return WriteAheadLog.open(self.wal_root, str(topic), config=self.wal_config, initial_offset=initial_offset,
                                  fs=self.wal_fs, metrics_registry=self.metrics_registry, group=self.group,
                                  budgets=self.budgets)

    def open_local(self, topic: TopicName) -> WriteAheadLog:
        """Open this broker's existing WAL of ``topic``; LocalWalUnreadable if it does not."""
        try:
            return self.open_wal(topic)
        except WalLocked:
            raise  # someone else has it open: not unreadable, and nothing to decide here
        except WalFailed as e:
            if self.group is None or not self.group.failed:
                raise LocalWalUnreadable(topic, self.path(topic), e) from e
            # The root's commit group failed (a journal or segment sync error): the WAL is
            # not what is broken, and its segments may lack rounds only the journal holds,
            # so discarding it would lose them. Only a restart (whose replay restores them)
            # helps; every topic of the root stays unloaded until then.
            raise LoadError(topic, "open WAL", f"the commit group of WAL root {self.wal_root} failed ({e}); "
                            "restart the broker: its journal replay restores what only the journal holds. "
                            f"The local WAL {self.path(topic)} is kept as it is") from e
        except OSError as e:
            if e.errno in _ENVIRONMENT_ERRNOS:
                # Disk full, quota, read-only or permissions: nothing says the WAL is damaged,
                # so no "discard it" advice; the operator frees space (or fixes) and retries.
                raise LoadError(topic, "open WAL", f"local WAL {self.path(topic)} cannot be opened "
                                f"now ({e.strerror}); it is kept as it is: fix that and retry") from e
            raise LocalWalUnreadable(topic, self.path(topic), e) from e
        except (CorruptLog, CodecError) as e:  # its files are damaged (CorruptSegmentHeader is a CodecError)
            raise LocalWalUnreadable(topic, self.path(topic), e) from e
        except Exception as e:  # noqa: BLE001 - whatever the reason, the WAL is kept as it is
            # Not known damage of the WAL (a setting native code cannot take, a resource, a
            # bug): LocalWalUnreadable would advise discarding it, which records its
            # acknowledged messages as lost and helps nothing. The load fails; the WAL stays.
            raise LoadError(topic, "open WAL", f"local WAL {self.path(topic)} could not be opened ({e!r}); nothing "
                            "says its files are damaged, so it is kept as it is and discarding it is not the "
                            "remedy") from e



def encode_marker(body: Mapping[str, object]) -> bytes:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({**body, "crc32c": crc32c(text.encode())}, sort_keys=True).encode()


def decode_marker(raw: bytes) -> dict[str, object] | None:
    """The marker's fields, or None when it does not parse or its checksum is wrong (a
    flipped digit in an epoch must not decide which history a WAL is)."""
    try:
        body: dict[str, object] = json.loads(raw)
        crc = body.pop("crc32c")
    except (ValueError, KeyError, AttributeError, TypeError, RecursionError):  # RecursionError: nested too deep
        return None
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return body if crc == crc32c(text.encode()) else None



def durable_tip(wal: WalOffsets) -> int | None:
    """Highest fsynced offset of ``wal`` (None when nothing is durable)."""
    durable = wal.durable_offset
    return durable if durable is None or durable >= 0 else None
