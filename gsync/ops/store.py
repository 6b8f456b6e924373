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
two things do, each with one line and a non-zero exit: another instance holding the lock
(``StateLocked``), and a database written by a newer gsync (``StateTooNew``).
"""
from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import time

DB_NAME = "gsync.db"
LOCK_NAME = "gsync.lock"
WAL_SIZE_LIMIT = 16 * 1024 * 1024  # bytes of WAL file kept after a checkpoint
LEGACY_REJECTED = "rejected.json"  # before the database: the cold tier, rewritten each minute

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
        except OSError as exc:  # not ours to fix by restarting: say so and stop
            raise StateRefused(f"cannot use state_dir {state_dir}: {exc.strerror or exc}") from None
        try:
            store._open_db()
        except _Unreadable as exc:  # a fresh database cannot be made there either
            store.close()
            raise StateRefused(f"cannot create {store.path}: {exc}") from None
        except BaseException:
            store.close()
            raise
        return store

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
        return target

    def reset(self, reason: str) -> None:
        """The database opened but its content is unreadable: aside, and start empty."""
        self.move_aside(DB_NAME, reason)
        self._connect()

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
        with _transaction(db):
            if rejected_puts:
                db.executemany("INSERT OR REPLACE INTO rejected (id, entry) VALUES (?, ?)", rejected_puts)
            if rejected_deletes:
                db.executemany("DELETE FROM rejected WHERE id = ?", ((i,) for i in rejected_deletes))
            for url in forget_relays:
                db.execute("DELETE FROM relays WHERE url = ?", (url,))
                db.execute("DELETE FROM confirmed WHERE relay = ?", (url,))
                db.execute("DELETE FROM members WHERE relay = ?", (url,))
            if relays:
                db.executemany("INSERT OR REPLACE INTO relays (url, memory, saved_at) VALUES (?, ?, ?)",
                               ((url, json.dumps(m, separators=(",", ":")), now) for url, m in relays.items()))
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
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
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


class _transaction:
    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, exc, tb):
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        return False
