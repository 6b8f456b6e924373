"""``state_dir``: the embedded database that survives restarts (SPEC §5, "What survives a
restart"), and the lock that keeps it to one instance.

stdlib ``sqlite3`` in WAL mode, its schema numbered by ``PRAGMA user_version`` and brought
up to date by ``MIGRATIONS``. It holds the rejected index (row per entry, written by change),
each relay's memory (``sync.memory``: one JSON record per relay) and each relay's confirmed
items (row per item) and thread members (row per member). Writes come in one transaction per save, from the manager's
maintenance tick: a few rows a tick on local disk, well under a millisecond each.

Here rather than in ``sync/``: it does I/O (a file lock, a database), which the pure layer
never does; what is kept and how it is read back is decided in ``sync.memory`` and
``sync.rejected``, which this module only stores.

Bad or foreign state never stops gsync (one log line, the file moved aside, a fresh start);
only a file SQLite calls malformed or not a database (or whose content gsync cannot read) is
bad. What the state_dir's surroundings do wrong stops gsync at start, with one line naming
the cause and the fix and a non-zero exit (``ops.cli`` has the codes), and never moves a
healthy database aside: another instance holding the lock (``StateLocked``), a database
written by a newer gsync (``StateTooNew``), a state_dir or database gsync may not write
(``StateUnwritable``: permissions, a read-only file system), and a disk that is full or
failing (``StateDiskFailing``: no space, an I/O error, the file locked by another program).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
import time

DB_NAME = "gsync.db"
LOCK_NAME = "gsync.lock"
WAL_SIZE_LIMIT = 16 * 1024 * 1024  # bytes of WAL file kept after a checkpoint
LEGACY_REJECTED = "rejected.json"  # before the database: the cold tier, rewritten each minute
KEEP_MOVED_ASIDE = 3  # the newest files moved aside kept per name: a start that fails each time
# on a bad file cannot fill the disk with copies
OPENED_AT = "opened_at"  # meta key written at open: proves the database takes writes

# Index i brings a database at user_version i to i + 1.
MIGRATIONS = (
    (
        "CREATE TABLE rejected (id TEXT PRIMARY KEY, entry TEXT NOT NULL) WITHOUT ROWID",
        "CREATE TABLE relays (url TEXT PRIMARY KEY, memory TEXT NOT NULL, saved_at REAL NOT NULL)",
        "CREATE TABLE confirmed (relay TEXT NOT NULL, item TEXT NOT NULL, level INTEGER NOT NULL,"
        " PRIMARY KEY (relay, item)) WITHOUT ROWID",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ),
    (  # 2: thread members per relay (their descendants are synced), with the roots they tag
        "CREATE TABLE members (relay TEXT NOT NULL, member TEXT NOT NULL, roots TEXT NOT NULL,"
        " PRIMARY KEY (relay, member)) WITHOUT ROWID",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)


class StateRefused(Exception):
    """gsync must not start on this ``state_dir``; the message says why, in one line."""


class StateLocked(StateRefused):
    pass


class StateTooNew(StateRefused):
    pass


class StateUnwritable(StateRefused):
    """state_dir or the database may not be written (permissions, a read-only file system):
    an operator must change that; restarting cannot."""


class StateDiskFailing(StateRefused):
    """The disk under state_dir is full or failing (or another program holds the database):
    it may pass, so a restart later may work."""


# SQLite's primary result codes (``sqlite3.Error.sqlite_errorcode & 0xff``) that describe the
# file's surroundings, not its content: such an error never moves the database aside. The
# others (SQLITE_CORRUPT, SQLITE_NOTADB, a schema gsync cannot read) are the file's own.
SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_NOMEM, SQLITE_READONLY = 3, 5, 6, 7, 8
SQLITE_INTERRUPT, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_PROTOCOL = 9, 10, 13, 14, 15
SQLITE_NOLFS, SQLITE_AUTH = 22, 23
_SQLITE_UNWRITABLE = (SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN, SQLITE_AUTH)
_SQLITE_HELD = (SQLITE_BUSY, SQLITE_LOCKED, SQLITE_PROTOCOL)
_SQLITE_DISK = (SQLITE_NOMEM, SQLITE_INTERRUPT, SQLITE_IOERR, SQLITE_FULL, SQLITE_NOLFS)
_ERRNO_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_ERRNO_FULL = (errno.ENOSPC, errno.EDQUOT)
LOW_SPACE_BYTES = 1024 * 1024  # free space under which an I/O error is called a full disk


def environmental(exc: BaseException, state_dir: str, path: str) -> StateRefused | None:
    """``exc`` (an ``OSError`` or ``sqlite3.Error`` met using ``path`` in ``state_dir``) as the
    refusal that names its cause and fix, or None when it says the file itself is bad."""
    if isinstance(exc, sqlite3.Error):
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code in _SQLITE_UNWRITABLE:
            return _unwritable(path, str(exc))
        if code == SQLITE_FULL or (code == SQLITE_IOERR and _low_on_space(state_dir)):
            return _full(state_dir, path, str(exc))
        if code in _SQLITE_HELD:
            return StateDiskFailing(f"{path} is locked by another program ({exc}): stop it "
                                    f"(one gsync per state_dir, nothing else), then start gsync again")
        if code in _SQLITE_DISK:
            return _io_error(state_dir, path, str(exc))
        return None
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        where = exc.filename or path
        if exc.errno in _ERRNO_UNWRITABLE:
            return _unwritable(where, reason)
        if exc.errno in _ERRNO_FULL:
            return _full(state_dir, where, reason)
        if exc.errno == errno.EIO:
            return _io_error(state_dir, where, reason)
        return StateRefused(f"cannot use state_dir {state_dir}: {reason}")
    return None


def _unwritable(path: str, reason: str) -> StateUnwritable:
    return StateUnwritable(
        f"cannot write {path} ({reason}): make state_dir and everything in it writable by the "
        f"user gsync runs as (a read-only mount, or files owned by another user?), or set "
        f"[service] state_dir to a directory it may write")


def _full(state_dir: str, path: str, reason: str) -> StateDiskFailing:
    return StateDiskFailing(f"the disk under state_dir {state_dir} is full ({path}: {reason}): "
                            f"free space there, then start gsync again; the database is kept")


def _io_error(state_dir: str, path: str, reason: str) -> StateDiskFailing:
    return StateDiskFailing(f"the disk under state_dir {state_dir} failed a read or write "
                            f"({path}: {reason}): check the disk (dmesg, SMART), then start gsync "
                            f"again; the database is kept")


def _low_on_space(directory: str) -> bool:
    try:
        fs = os.statvfs(directory)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < LOW_SPACE_BYTES


class _Unreadable(Exception):
    """The database file is not one this gsync can read: move it aside."""


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8")  # invalid UTF-8 raises: the whole file goes aside


class StateStore:
    """One instance's hold on ``state_dir``. ``open`` takes the lock and reads what is
    there; ``load_*`` give it back; ``save`` writes what changed; ``close`` releases."""

    def __init__(self, state_dir: str, log):
        self.dir = state_dir
        self.path = os.path.join(state_dir, DB_NAME)
        self.log = log
        self.db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self.saved_at: float | None = None  # wall clock of the last successful save
        self.moved_aside: list[str] = []

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, state_dir: str, log) -> StateStore:
        store = cls(state_dir, log)
        try:
            os.makedirs(state_dir, exist_ok=True)
            store._lock()
        except OSError as exc:  # say what to do, and stop
            raise environmental(exc, state_dir, state_dir) from None
        try:
            store._open_db()
            now = time.time()
            store.save(now, meta={OPENED_AT: repr(now)})  # it takes writes: found now, not later
        except _Unreadable as exc:  # a fresh database cannot be made there either
            store.close()
            raise StateRefused(f"cannot create {store.path}: {exc}") from None
        except (OSError, sqlite3.Error) as exc:
            store.close()
            raise store.refusal(exc) from None
        except BaseException:
            store.close()
            raise
        return store

    def refusal(self, exc: BaseException) -> StateRefused:
        """What an error met on the database says to do: never a reason to move it aside."""
        return environmental(exc, self.dir, self.path) or StateRefused(
            f"cannot use {self.path}: {type(exc).__name__}: {exc}")

    def _lock(self) -> None:
        path = os.path.join(self.dir, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise StateLocked(f"state_dir {self.dir} is in use by another gsync"
                              f"{f' (pid {holder})' if holder else ''}: one instance per state_dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def _open_db(self) -> None:
        try:
            self._connect()
        except _Unreadable as exc:
            self.move_aside(DB_NAME, str(exc))
            self._connect()

    def _connect(self) -> None:
        db = None
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.text_factory = _decode
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                db.close()
                raise StateTooNew(
                    f"{self.path} was written by a newer gsync (schema {version}, this one knows "
                    f"{SCHEMA_VERSION}): upgrade gsync, or move the file away to start fresh")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise _Unreadable(f"quick_check: {check}")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoints, never corrupt
            db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")  # a big first save's WAL shrinks
            for step in range(version, SCHEMA_VERSION):
                with _transaction(db):
                    for sql in MIGRATIONS[step]:
                        db.execute(sql)
                    db.execute(f"PRAGMA user_version = {step + 1}")
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            if db is not None:
                db.close()
            if environmental(exc, self.dir, self.path) is not None:
                raise  # the disk or the permissions, not the file: open() says which
            raise _Unreadable(f"{type(exc).__name__}: {exc}") from None
        self.db = db

    def move_aside(self, name: str, reason: str) -> str:
        """``name`` in state_dir (and a database's WAL files) renamed ``name.bad-<time>``:
        kept for whoever wants to look, out of gsync's way."""
        if name == DB_NAME and self.db is not None:
            self.db.close()
            self.db = None
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = os.path.join(self.dir, f"{name}.bad-{stamp}")
        for suffix in ("", "-wal", "-shm") if name == DB_NAME else ("",):
            source = os.path.join(self.dir, name + suffix)
            if os.path.exists(source):
                os.replace(source, target + suffix)
        self.log.warning("state_moved_aside", path=os.path.join(self.dir, name), moved_to=target,
                         reason=reason[:300])
        self.moved_aside.append(target)
        self._prune_moved_aside(name)
        return target

    def _prune_moved_aside(self, name: str) -> None:
        """Only the newest ``KEEP_MOVED_ASIDE`` of ``name.bad-*`` stay (their stamps sort
        by time)."""
        prefix = f"{name}.bad-"
        stamps = sorted({entry[len(prefix):].split("-", 1)[0] for entry in os.listdir(self.dir)
                         if entry.startswith(prefix)})
        for stamp in stamps[:-KEEP_MOVED_ASIDE]:
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.remove(os.path.join(self.dir, prefix + stamp + suffix))
                except OSError:
                    pass  # gone already, or not ours to remove: it costs only its space

    def reset(self, reason: str) -> None:
        """The database opened but its content is unreadable: aside, and start empty."""
        try:
            self.move_aside(DB_NAME, reason)
            self._connect()
        except (OSError, sqlite3.Error) as exc:
            raise self.refusal(exc) from None

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    # -- reading ----------------------------------------------------------------------------

    def rejected_rows(self) -> list[tuple[str, str]]:
        return self.db.execute("SELECT id, entry FROM rejected").fetchall()

    def relay_memories(self) -> dict[str, dict]:
        out = {}
        for url, text in self.db.execute("SELECT url, memory FROM relays"):
            try:
                memory = json.loads(text)
            except ValueError:
                continue  # that relay starts fresh
            if isinstance(memory, dict):
                out[url] = memory
        return out

    def confirmed_rows(self) -> dict[str, list[tuple[str, int]]]:
        out: dict[str, list[tuple[str, int]]] = {}
        for relay, item, level in self.db.execute("SELECT relay, item, level FROM confirmed"):
            out.setdefault(relay, []).append((item, level))
        return out

    def member_rows(self) -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = {}
        for relay, member, roots in self.db.execute("SELECT relay, member, roots FROM members"):
            out.setdefault(relay, []).append((member, roots))
        return out

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    # -- writing ----------------------------------------------------------------------------

    def save(self, now: float, *, rejected_puts=(), rejected_deletes=(), relays=None,
             forget_relays=(), confirmed_puts=None, confirmed_deletes=None, member_puts=None,
             member_deletes=None, meta=None) -> None:
        """One transaction of what changed. ``relays``: url → memory record;
        ``forget_relays``: urls whose rows all go; ``confirmed_puts``: relay → {item: level};
        ``confirmed_deletes``: relay → [item]; ``member_puts``: relay → {member: roots};
        ``member_deletes``: relay → [member]. Raises ``sqlite3.Error``/``OSError`` (a full
        disk, say): the caller keeps its changes for the next save."""
        db = self.db
        if (meta and len(meta) == 1 and not (rejected_puts or rejected_deletes or relays or forget_relays
                                             or confirmed_puts or confirmed_deletes or member_puts or member_deletes)):
            # most saves: nothing changed but the time. One statement is its own transaction
            # (BEGIN and COMMIT around it cost as much again)
            ((key, value),) = meta.items()
            _put_meta(db, key, value)
            self.saved_at = now
            return
        with _transaction(db):
            if rejected_puts:
                db.executemany("INSERT OR REPLACE INTO rejected (id, entry) VALUES (?, ?)", rejected_puts)
            if rejected_deletes:
                db.executemany("DELETE FROM rejected WHERE id = ?", ((i,) for i in rejected_deletes))
            for url in forget_relays:
                db.execute("DELETE FROM relays WHERE url = ?", (url,))
                db.execute("DELETE FROM confirmed WHERE relay = ?", (url,))
                db.execute("DELETE FROM members WHERE relay = ?", (url,))
            for url, m in (relays or {}).items():  # (an UPDATE where the row is: as _put_meta)
                text = _compact(m)
                if not db.execute("UPDATE relays SET memory = ?, saved_at = ? WHERE url = ?", (text, now, url)).rowcount:
                    db.execute("INSERT INTO relays (url, memory, saved_at) VALUES (?, ?, ?)", (url, text, now))
            for relay, rows in (confirmed_puts or {}).items():
                db.executemany("INSERT OR REPLACE INTO confirmed (relay, item, level) VALUES (?, ?, ?)",
                               ((relay, item, level) for item, level in rows.items()))
            for relay, items in (confirmed_deletes or {}).items():
                db.executemany("DELETE FROM confirmed WHERE relay = ? AND item = ?",
                               ((relay, item) for item in items))
            for relay, rows in (member_puts or {}).items():
                db.executemany("INSERT OR REPLACE INTO members (relay, member, roots) VALUES (?, ?, ?)",
                               ((relay, member, roots) for member, roots in rows.items()))
            for relay, members in (member_deletes or {}).items():
                db.executemany("DELETE FROM members WHERE relay = ? AND member = ?",
                               ((relay, member) for member in members))
            for key, value in (meta or {}).items():
                _put_meta(db, key, value)
        self.saved_at = now

    def read_legacy_rejected(self) -> str | None:
        """The old ``rejected.json``'s text, once: None if there is none, or if it is not
        UTF-8 (then it is moved aside)."""
        path = os.path.join(self.dir, LEGACY_REJECTED)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.move_aside(LEGACY_REJECTED, f"not UTF-8: {exc}")
            return None

    def retire_legacy_rejected(self) -> None:
        """Migrated: the old file is kept beside as ``rejected.json.migrated`` (a downgrade
        can still read it), and never read again."""
        path = os.path.join(self.dir, LEGACY_REJECTED)
        if os.path.exists(path):
            os.replace(path, path + ".migrated")


# ``json.dumps(m, separators=...)`` made an encoder at each call: most of a record's cost
_compact = json.JSONEncoder(separators=(",", ":")).encode


def _put_meta(db: sqlite3.Connection, key: str, value: str) -> None:
    """An UPDATE where the row is (INSERT OR REPLACE deletes and inserts: it writes the key's
    index page as well as the row's, a second page at every save)."""
    if not db.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key)).rowcount:
        db.execute("INSERT INTO meta (key, value) VALUES (?, ?)", (key, value))


class _transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, exc, tb):
        if kind is None:
            self.db.execute("COMMIT")
        elif self.db.in_transaction:  # SQLite rolls back on its own after some errors (a full
            # disk): a ROLLBACK then would fail, and hide the error that says what happened
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the error being raised is the one to report
        return False
