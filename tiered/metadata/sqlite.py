"""Embedded metadata store on one SQLite file (kine-style), the default without etcd.

Several processes may open the same file at once (the CLI seals in one process and
restores in another):

* WAL journal, so readers never block the single writer.
* Every write is ``BEGIN IMMEDIATE`` (takes the write lock up front, so two
  read-compare-write transactions cannot interleave) with a bounded busy timeout;
  a lock not obtained in time is :class:`~tiered.errors.OperationTimeout`.
* ``synchronous=FULL``: a committed transaction survives power loss, which seal
  state and ownership records need.

Tables: ``kv`` (current value per key), ``log`` (one row per change, keyed by
``(revision, sub)``; a NULL value is a delete), ``state`` (the global revision and
the compaction point) and ``lease``. Watches poll ``log`` every
``watch_poll_interval_s`` on their own connection, so delivery latency is bounded by
that interval plus one query. Lease deadlines are on ``CLOCK_BOOTTIME`` (one clock for
every process of the machine, which a wall-clock step cannot move: an NTP step forward
must not expire a live broker's lease and let its topics be taken over), stamped with
the kernel's boot id: leases stamped under another boot id are re-armed for one TTL at
open (their deadlines were on another clock; a live holder refreshes, a dead one's lapse). Expiry is swept lazily by any operation and
by every watch poll. The file is for processes of ONE machine (as SQLite itself is).

Keys are stored as UTF-8 BLOBs so ordering and prefix ranges are byte-wise, as in
etcd. History older than ``history_revisions_max`` is compacted automatically.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from tiered.errors import (
    CompactedRevision,
    LeaseNotFound,
    MetadataError,
    OperationTimeout,
    StorageError,
    StorageUnavailable,
)
from tiered.metadata.base import (
    Compare,
    Delete,
    DeleteEvent,
    Get,
    KeyValue,
    Lease,
    lease_clock,
    MetadataStore,
    Op,
    Put,
    PutEvent,
    ReadView,
    TxnResult,
    Watch,
    check_key,
    check_ops,
    prefix_end,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # not Linux: no reboot detection, the monotonic clock alone
        return "unknown"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key BLOB PRIMARY KEY, value BLOB NOT NULL, create_revision INTEGER NOT NULL,
    mod_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease_id INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_lease ON kv(lease_id) WHERE lease_id != 0;
CREATE TABLE IF NOT EXISTS log (
    revision INTEGER NOT NULL, sub INTEGER NOT NULL, key BLOB NOT NULL, value BLOB,
    create_revision INTEGER NOT NULL, version INTEGER NOT NULL, lease_id INTEGER NOT NULL,
    PRIMARY KEY (revision, sub)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO state VALUES ('revision', 1), ('compact_revision', 0), ('lease_seq', 0);
CREATE TABLE IF NOT EXISTS lease (
    id INTEGER PRIMARY KEY, ttl_s REAL NOT NULL, expires_at REAL NOT NULL
);
"""

_KV_COLUMNS = "key, value, create_revision, mod_revision, version, lease_id"

#: A row as sqlite3 returns it (columns as selected: blobs, integers, NULLs).
_Row = tuple[Any, ...]


def _row_to_kv(row: _Row) -> KeyValue:
    return KeyValue(row[0].decode(), bytes(row[1]), row[2], row[3], row[4], row[5])


class _WriteTx:
    """One ``BEGIN IMMEDIATE`` transaction; all its changes share one revision."""

    def __init__(self, cur: sqlite3.Cursor, revision: int) -> None:
        self.cur = cur
        self.revision = revision  # the revision these writes will get
        self.sub = 0

    def lookup(self, key: str) -> KeyValue | None:
        row = self.cur.execute(
            f"SELECT {_KV_COLUMNS} FROM kv WHERE key = ?", (key.encode(),)
        ).fetchone()
        return None if row is None else _row_to_kv(row)

    def put(self, key: str, value: bytes, lease_id: int) -> None:
        if lease_id and not self.cur.execute(
            "SELECT 1 FROM lease WHERE id = ?", (lease_id,)
        ).fetchone():
            raise LeaseNotFound(f"lease {lease_id:x} not found")
        old = self.lookup(key)
        create = self.revision if old is None else old.create_revision
        version = 1 if old is None else old.version + 1
        kb = key.encode()
        self.cur.execute(
            "INSERT OR REPLACE INTO kv VALUES (?, ?, ?, ?, ?, ?)",
            (kb, value, create, self.revision, version, lease_id),
        )
        self._log(kb, value, create, version, lease_id)

    def delete(self, key: str) -> bool:
        kb = key.encode()
        if self.cur.execute("DELETE FROM kv WHERE key = ?", (kb,)).rowcount == 0:
            return False
        self._log(kb, None, 0, 0, 0)
        return True

    def _log(self, kb: bytes, value: bytes | None, create: int, version: int, lease: int) -> None:
        self.cur.execute(
            "INSERT INTO log VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.revision, self.sub, kb, value, create, version, lease),
        )
        self.sub += 1

    @property
    def wrote(self) -> bool:
        return self.sub > 0


class SqliteMetadataStore(MetadataStore):
    """Metadata store in one SQLite file. See the module docstring."""
    multi_process = True
    supports_compaction = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = 5.0,
        watch_poll_interval_s: float = 0.02,
        history_revisions_max: int = 100_000,
    ) -> None:
        self.path = os.fspath(path)
        self.busy_timeout_s = busy_timeout_s
        self.watch_poll_interval_s = watch_poll_interval_s
        self.history_revisions_max = history_revisions_max
        self._lock = threading.RLock()
        self._closed = False
        self._watches: set[Watch] = set()
        self._conn = self._connect()
        self._init_schema()
        self._check_lease_clock()

    # -- connections -------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        with _mapped(self.path):
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # guarded by self._lock
            )
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            conn.execute("PRAGMA synchronous = FULL")
            return conn

    def _init_schema(self) -> None:
        # Switching to WAL needs a moment of exclusive access; several processes
        # opening a fresh file at once may see "locked", so retry within the bound.
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                # An existing store needs no write lock to open (another process may hold it).
                if self._conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'lease'").fetchone():
                    return
                self._conn.execute("PRAGMA journal_mode = WAL")
                self._create_tables()
                return
            except sqlite3.OperationalError as e:
                if time.monotonic() > deadline:
                    raise OperationTimeout(f"sqlite {self.path}: could not initialise: {e}") from e
                time.sleep(0.01)

    def _create_tables(self) -> None:
        # executescript() would COMMIT implicitly, so run statement by statement.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._conn.execute(statement)
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    # -- transactions ------------------------------------------------------
    def _write(self, fn: Callable[[_WriteTx], T]) -> T:
        """Run ``fn`` inside BEGIN IMMEDIATE; bump the revision if it wrote."""
        with self._lock, _mapped(self.path):
            self._check_open()
            cur = self._conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                revision = self._read_state(cur, "revision")
                tx = _WriteTx(cur, revision + 1)
                result = fn(tx)
                if tx.wrote:
                    cur.execute("UPDATE state SET value = ? WHERE name = 'revision'", (tx.revision,))
                    self._auto_compact(cur, tx.revision)
                cur.execute("COMMIT")
                return result
            except BaseException:
                if self._conn.in_transaction:
                    cur.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Cursor]:
        """A consistent snapshot for multi-statement reads."""
        with self._lock, _mapped(self.path):
            self._check_open()
            cur = self._conn.cursor()
            cur.execute("BEGIN")
            try:
                yield cur
            finally:
                cur.execute("COMMIT")

    @staticmethod
    def _read_state(cur: sqlite3.Cursor, name: str) -> int:
        value: int = cur.execute("SELECT value FROM state WHERE name = ?", (name,)).fetchone()[0]
        return value

    def _auto_compact(self, cur: sqlite3.Cursor, revision: int) -> None:
        # Amortised: look only every 1,000 revisions.
        if self.history_revisions_max <= 0 or revision % 1000:
            return
        floor = revision - self.history_revisions_max
        if floor > self._read_state(cur, "compact_revision"):
            self._compact_in(cur, floor)

    @staticmethod
    def _compact_in(cur: sqlite3.Cursor, revision: int) -> None:
        cur.execute("DELETE FROM log WHERE revision < ?", (revision,))
        cur.execute("UPDATE state SET value = ? WHERE name = 'compact_revision'", (revision,))

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"metadata store {self.path} is closed")

    # -- leases ------------------------------------------------------------
    def _check_lease_clock(self) -> None:
        """Re-arm leases stamped by another boot (their deadlines are on its clock)."""
        boot = _boot_id()
        with self._lock, _mapped(self.path):
            try:
                row = self._conn.execute("SELECT value FROM lease_clock WHERE name = 'boot_id'").fetchone()
            except sqlite3.OperationalError:
                row = None  # a store from before lease_clock existed
        if row is not None and row[0] == boot:
            return

        def reset(tx: _WriteTx) -> None:
            tx.cur.execute("CREATE TABLE IF NOT EXISTS lease_clock (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            again = tx.cur.execute("SELECT value FROM lease_clock WHERE name = 'boot_id'").fetchone()
            if again is not None and again[0] == boot:
                return  # another process of this boot got here first
            # Their deadlines are on another clock. Revoking them would take a live
            # holder's lease (a process that reads another boot id is not proof the holders
            # died: an unreadable /proc gives "unknown"), so each is re-armed for one TTL on
            # this clock instead: a live holder refreshes it as usual, a dead one's lapses.
            now = lease_clock()
            count = tx.cur.execute("UPDATE lease SET expires_at = ? + ttl_s", (now,)).rowcount
            tx.cur.execute("INSERT OR REPLACE INTO lease_clock VALUES ('boot_id', ?)", (boot,))
            if count:
                log.info("sqlite %s: %d lease(s) stamped by another boot re-armed for one TTL", self.path, count)

        self._write(reset)

    def _expire_due_leases(self) -> None:
        """Delete keys of expired leases. Cheap read first; write only when due."""
        now = lease_clock()
        with self._lock, _mapped(self.path):
            self._check_open()
            due = self._conn.execute("SELECT 1 FROM lease WHERE expires_at <= ? LIMIT 1", (now,)).fetchone()
        if due:
            self._write(lambda tx: self._revoke_due(tx, now))

    @staticmethod
    def _revoke_due(tx: _WriteTx, now: float) -> None:
        ids = [r[0] for r in tx.cur.execute("SELECT id FROM lease WHERE expires_at <= ?", (now,))]
        for lease_id in ids:
            _revoke_in(tx, lease_id)

    def grant_lease(self, ttl_s: float) -> Lease:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be positive, got {ttl_s}")

        def grant(tx: _WriteTx) -> int:
            seq = self._read_state(tx.cur, "lease_seq") + 1
            tx.cur.execute("UPDATE state SET value = ? WHERE name = 'lease_seq'", (seq,))
            # Random high bits keep ids unique even if the file is recreated.
            lease_id = (int.from_bytes(os.urandom(3), "big") << 32) | seq
            tx.cur.execute("INSERT INTO lease VALUES (?, ?, ?)", (lease_id, ttl_s, lease_clock() + ttl_s))
            return lease_id

        return Lease(self._write(grant), ttl_s)

    def refresh_lease(self, lease_id: int) -> None:
        self._expire_due_leases()

        def refresh(tx: _WriteTx) -> None:
            row = tx.cur.execute("SELECT ttl_s FROM lease WHERE id = ?", (lease_id,)).fetchone()
            if row is None:
                raise LeaseNotFound(f"lease {lease_id:x} expired or was revoked")
            tx.cur.execute("UPDATE lease SET expires_at = ? WHERE id = ?", (lease_clock() + row[0], lease_id))

        self._write(refresh)

    def revoke_lease(self, lease_id: int) -> None:
        def revoke(tx: _WriteTx) -> None:
            if not _revoke_in(tx, lease_id):
                raise LeaseNotFound(f"lease {lease_id:x} expired or was revoked")

        self._write(revoke)

    # -- key/value ---------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        check_key(key)
        self._expire_due_leases()
        with self._lock, _mapped(self.path):
            self._check_open()
            row = self._conn.execute(
                f"SELECT {_KV_COLUMNS} FROM kv WHERE key = ?", (key.encode(),)
            ).fetchone()
        return None if row is None else _row_to_kv(row)

    def put(self, key: str, value: bytes, lease_id: int = 0) -> int:
        check_ops([Put(key, value, lease_id)])
        self._expire_due_leases()

        def put(tx: _WriteTx) -> int:
            tx.put(key, value, lease_id)
            return tx.revision

        return self._write(put)

    def delete(self, key: str) -> bool:
        check_key(key)
        self._expire_due_leases()
        return self._write(lambda tx: tx.delete(key))

    def delete_prefix(self, prefix: str) -> int:
        self._expire_due_leases()

        def delete_all(tx: _WriteTx) -> int:
            keys = [kv.key for kv in self._range_in(tx.cur, prefix, 0, None)]
            for key in keys:
                tx.delete(key)
            return len(keys)

        return self._write(delete_all)

    def range(self, prefix: str, limit: int = 0, start_after: str | None = None) -> list[KeyValue]:
        self._expire_due_leases()
        with self._read() as cur:
            return self._range_in(cur, prefix, limit, start_after)

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[ReadView]:
        # One read transaction: SQLite shows it one database state throughout. It holds
        # the store's lock, so other threads of this process wait for the ``with``.
        self._expire_due_leases()
        with self._read() as cur:
            yield _SqliteView(cur, self._read_state(cur, "revision"))

    @staticmethod
    def _range_in(cur: sqlite3.Cursor, prefix: str, limit: int, start_after: str | None) -> list[KeyValue]:
        low = prefix.encode()
        if start_after is not None:
            low = max(low, start_after.encode() + b"\x00")
        high = prefix_end(prefix.encode())
        sql = f"SELECT {_KV_COLUMNS} FROM kv WHERE key >= ?"
        args: list[object] = [low]
        if high is not None:
            sql += " AND key < ?"
            args.append(high)
        sql += " ORDER BY key"
        if limit > 0:
            sql += " LIMIT ?"
            args.append(limit)
        return [_row_to_kv(r) for r in cur.execute(sql, args)]

    def txn(
        self, compare: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        check_ops(success)
        check_ops(failure)
        self._expire_due_leases()

        def run(tx: _WriteTx) -> TxnResult:
            ok = all(c.holds(tx.lookup(c.key)) for c in compare)
            responses = [_apply_op(tx, op) for op in (success if ok else failure)]
            return TxnResult(ok, responses, tx.revision if tx.wrote else tx.revision - 1)

        return self._write(run)

    def current_revision(self) -> int:
        with self._read() as cur:
            return self._read_state(cur, "revision")

    def compact(self, revision: int) -> None:
        def compact(tx: _WriteTx) -> None:
            current = self._read_state(tx.cur, "revision")
            if revision > current:
                raise ValueError(f"cannot compact to future revision {revision} (current {current})")
            if revision > self._read_state(tx.cur, "compact_revision"):
                self._compact_in(tx.cur, revision)

        self._write(compact)

    # -- watches -----------------------------------------------------------
    def watch_prefix(self, prefix: str, start_revision: int | None = None) -> Watch:
        if start_revision is None:
            start_revision = self.current_revision() + 1
        stop = threading.Event()
        watch = Watch(start_revision, cancel_hook=stop.set)
        poller = _WatchPoller(self, prefix, watch, stop)
        with self._lock:
            self._check_open()
            self._watches.add(watch)
        poller.start()
        return watch

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watches = list(self._watches)
            self._watches.clear()
        for watch in watches:
            watch.cancel()
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"SqliteMetadataStore({self.path!r})"


def _apply_op(tx: _WriteTx, op: Op) -> KeyValue | None | bool:
    if isinstance(op, Get):
        return tx.lookup(op.key)
    if isinstance(op, Put):
        tx.put(op.key, op.value, op.lease_id)
        return None
    assert isinstance(op, Delete)
    return tx.delete(op.key)


def _revoke_in(tx: _WriteTx, lease_id: int) -> bool:
    if tx.cur.execute("DELETE FROM lease WHERE id = ?", (lease_id,)).rowcount == 0:
        return False
    keys = [r[0].decode() for r in tx.cur.execute("SELECT key FROM kv WHERE lease_id = ? ORDER BY key", (lease_id,))]
    for key in keys:
        tx.delete(key)
    return True


class _WatchPoller(threading.Thread):
    """Polls the change log for one watch on its own connection."""

    _BATCH_ROWS_MAX = 1000

    def __init__(self, store: SqliteMetadataStore, prefix: str, watch: Watch, stop: threading.Event) -> None:
        super().__init__(name=f"sqlite-watch:{prefix}", daemon=True)
        self.store = store
        self.low = prefix.encode()
        self.high = prefix_end(self.low)
        self.watch = watch
        self.stop = stop
        self.next_revision = watch.next_revision

    def run(self) -> None:
        try:
            conn = self.store._connect()
        except StorageError as e:
            self.watch._fail(e)
            return
        try:
            while not self.stop.is_set():
                if not self._poll_once(conn):
                    self.stop.wait(self.store.watch_poll_interval_s)
        except StorageError as e:
            self.watch._fail(e)
        except Exception as e:  # a watch thread must never die silently
            log.exception("sqlite watch on %r failed", self.low)
            self.watch._fail(StorageError(f"watch failed: {e}"))
        finally:
            conn.close()

    def _poll_once(self, conn: sqlite3.Connection) -> bool:
        """Deliver one batch; True if there may be more right away."""
        with contextlib.suppress(StorageError):
            self.store._expire_due_leases()
        rows = self._fetch(conn)
        for row in rows:
            if not self.watch._deliver(_row_to_event(row)):
                self.stop.set()
                return False
            self.next_revision = row[0] + 1
        return len(rows) == self._BATCH_ROWS_MAX

    def _fetch(self, conn: sqlite3.Connection) -> list[_Row]:
        sql = (
            "SELECT revision, key, value, create_revision, version, lease_id FROM log"
            " WHERE revision >= ? AND key >= ?"
        )
        args: list[object] = [self.next_revision, self.low]
        if self.high is not None:
            sql += " AND key < ?"
            args.append(self.high)
        sql += f" ORDER BY revision, sub LIMIT {self._BATCH_ROWS_MAX}"
        with _mapped(self.store.path):
            conn.execute("BEGIN")
            try:
                compacted = conn.execute("SELECT value FROM state WHERE name = 'compact_revision'").fetchone()[0]
                if self.next_revision < compacted:
                    raise CompactedRevision(self.next_revision, compacted)
                return conn.execute(sql, args).fetchall()
            finally:
                conn.execute("COMMIT")


def _row_to_event(row: _Row) -> PutEvent | DeleteEvent:
    revision, kb, value, create, version, lease = row
    if value is None:
        return DeleteEvent(kb.decode(), revision)
    return PutEvent(KeyValue(kb.decode(), bytes(value), create, revision, version, lease))


@contextlib.contextmanager
def _mapped(path: str) -> Iterator[None]:
    """Map sqlite3 errors onto the storage hierarchy, keeping the cause."""
    try:
        yield
    except sqlite3.OperationalError as e:
        text = str(e)
        if "locked" in text or "busy" in text:
            raise OperationTimeout(f"sqlite {path}: lock not obtained in time: {text}") from e
        raise StorageUnavailable(f"sqlite {path}: {text}") from e
    except sqlite3.DatabaseError as e:
        raise MetadataError(f"sqlite {path}: {e}") from e


class _SqliteView(ReadView):
    """Reads inside one SQLite read transaction (:meth:`SqliteMetadataStore.snapshot`)."""

    def __init__(self, cur: sqlite3.Cursor, revision: int) -> None:
        self.cur = cur
        self.revision = revision

    def get(self, key: str) -> KeyValue | None:
        check_key(key)
        row = self.cur.execute(f"SELECT {_KV_COLUMNS} FROM kv WHERE key = ?", (key.encode(),)).fetchone()
        return None if row is None else _row_to_kv(row)

    def range(self, prefix: str, limit: int = 0, start_after: str | None = None) -> list[KeyValue]:
        return SqliteMetadataStore._range_in(self.cur, prefix, limit, start_after)
