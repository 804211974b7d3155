"""MLflow tracking: one parent run per sweep, one child run per (kernel config, problem size).

The store is resolved once, to an absolute location, by :class:`SweepCallback` at the start of a run
or multirun and exported as ``MLFLOW_TRACKING_URI`` so every job (and every launcher process) writes
to the same store. Default: ``sqlite:///<project>/outputs/mlflow.db``.

What the store guarantees (docs/usage.md, "Interruptions, concurrent sweeps and parallel launchers"):
- every run ends FINISHED (a skipped one too: tags ``outcome=skipped``, ``skip_reason``), FAILED (reason
  in tag ``error``) or KILLED (interrupted: tag ``outcome=interrupted``, reason in ``skip_reason``); runs a
  process leaves open (Ctrl-C, SIGTERM, a crash) are closed by :func:`abort_open_runs`; a running run's
  process refreshes its tag ``heartbeat_unix`` (:data:`HEARTBEAT`), and a run whose heartbeat is older
  than ``stale_after`` seconds (or whose process on this host is gone) is closed by the next command on
  any host that looks at it (KILLED, the reason in ``skip_reason``) and measured again;
- a measurement is identified by its run key; a key FINISHED, or RUNNING with a live heartbeat, is never
  measured again (:meth:`Tracker.claim`), so concurrent or repeated sweeps add no duplicates. A claim is
  atomic on every store (SQLite, a tracking server, the database behind one), from any number of hosts:
  it creates a marker experiment whose name only one creator can have (:func:`claim_marker`);
- a sweep owns every measurement it asked for: a run it measured is its child (``mlflow.parentRunId``,
  one parent per run), and a run it found already measured joins it too, marked as reused: tag
  ``in_sweep.<parent run id>`` (:data:`MEMBER`) is ``new`` on a sweep's own runs and ``reused`` on the
  runs it reused; :func:`sweep_runs` is how every reader finds a sweep's runs. The run key is looked up
  within one experiment: a sweep into another experiment (``tracking.experiment``) measures anew there,
  so each experiment holds its own runs and its readers never look into another;
- a sweep's parent run is found again by its sweep key (the sweep's overrides) and created only when
  the sweep adds its first run, so a re-run continues under the same parent and no parent is empty.
On a SQLite store the read-check-write steps also run under a file lock beside the database (fewer
retries of SQLite's own write lock on one host).
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import math
import numbers
import os
import re
import shlex
import socket
import tempfile
import threading
import time
import weakref
from pathlib import Path
from urllib.parse import unquote

from .record import MEMBER, NEW, REUSED

__all__ = ["PROJECT_ROOT", "StoreError", "UriError", "StoreUnavailable", "resolve_uri", "store_lock",
           "check_schema", "current_sweep", "Tracker", "flatten", "run_key", "get_tracker", "trackers",
           "abort_open_runs", "SWEEP_ENV", "MEMBER", "sweep_runs", "sweeps_of", "unwritable", "claim_marker",
           "OWNER", "STALE_AFTER_S"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
HOST, PID = socket.gethostname(), os.getpid()
START_MS = int(time.time() * 1000)      # about when this process started (runs newer than it are its)
# what the sweep's start hands to its jobs (also to jobs in other processes of a parallel launcher)
SWEEP_ENV = {"key": "TCA_SWEEP_KEY", "name": "TCA_SWEEP_NAME", "jobs": "TCA_SWEEP_JOBS",
             "overrides": "TCA_SWEEP_OVERRIDES", "parent": "TCA_PARENT_RUN_ID", "values": "TCA_SWEEP_VALUES",
             "uri": "TCA_TRACKING_URI", "experiment": "TCA_EXPERIMENT"}


STORE_WAIT_S = 30.0      # how long a write waits for another process's write transaction (tracking.wait)
STALE_AFTER_S = 300.0    # a RUNNING run whose heartbeat is older is closed as KILLED (tracking.stale_after_s)
HEARTBEAT = "heartbeat_unix"     # tag: when the run's process last said it is alive (unix seconds)
CLAIMS = ".claims"       # name prefix of the marker experiments of claims (claim_marker)
# tags every run this process starts carries: who owns it (a Slurm job adds slurm_job_id)
OWNER = {"owner_host": HOST, "owner_pid": str(PID)}


def _forked() -> None:
    """In a process forked from this one (a fork server that imported this module): its own pid and
    start, not those of the process it was forked from."""
    global PID, START_MS
    PID, START_MS = os.getpid(), int(time.time() * 1000)
    OWNER["owner_pid"] = str(PID)


os.register_at_fork(after_in_child=_forked)


class StoreError(RuntimeError):
    """The tracking store cannot be used as asked; the message says why and what to do."""


class UriError(StoreError):
    """The tracking URI as written names no store this tool can use (its form, not the store behind
    it): a usage error, which run.py refuses with exit status 2 before any work."""


class StoreUnavailable(BaseException):
    """A SQLite store stopped taking writes: another process held its write lock past the wait, or
    its disk is full. Like KeyboardInterrupt it ends the command wherever it is raised (no job can go
    on without its store, and each would wait again): run.py closes what it can and prints the
    message, one line naming the lock's holder or the full disk and what to do."""


def resolve_uri(uri: str | None, base: Path | None = None, create: bool = True) -> str:
    """Absolute tracking URI: ``uri``, else $MLFLOW_TRACKING_URI, else the project's SQLite store.

    A relative ``sqlite:///path`` is made absolute against ``base`` (default: the current directory)
    and, with ``create``, its folder is made. The path is the text after ``sqlite:///`` with its
    percent-escapes decoded as SQLAlchemy decodes them (``%20`` is a space), ``~`` the home folder and
    ``..`` resolved. ``http(s)://`` and ``databricks`` URIs are kept.
    Raises UriError (a StoreError: the URI as written names no usable store) for a '?' or '%' in the
    path (:func:`_odd_path` says why), for a file store (``file:...`` or a plain folder: MLflow 3 keeps
    runs in a database; the message gives the SQLite URI to use instead), for ``sqlite:`` spelled
    otherwise than ``sqlite:///`` (``sqlite://``, ``SQLITE:///``), for an in-memory SQLite store
    (``sqlite:///``, ``sqlite:///:memory:``), for another scheme (``ftp://``, ``s3://``) and for an
    empty ``uri`` (None is the default); StoreError for a path that cannot hold a store (a file in its
    way, a read-only folder).
    """
    if uri is not None and not uri.strip():
        raise UriError("the tracking URI is empty: give one (sqlite:///PATH, http://HOST:PORT), or leave "
                       "it out for the default store (tracking.uri=null; $MLFLOW_TRACKING_URI, else "
                       "outputs/mlflow.db)")
    uri = (uri or os.environ.get("MLFLOW_TRACKING_URI") or "").strip()
    base = Path(base or os.getcwd())
    if not uri:
        path = PROJECT_ROOT / "outputs" / "mlflow.db"
    elif uri.lower().startswith("sqlite:") and not uri.startswith("sqlite:///"):
        rest = uri[len("sqlite:"):]
        given = rest[3:] if rest.startswith("///") else rest[2:] if rest.startswith("//") else rest
        example = base / (given or "mlflow.db")         # sqlite:/abs/x.db keeps its absolute path
        raise UriError(f"the tracking URI {uri} is no SQLite URI: write sqlite:/// and the database "
                       f"file's path, e.g. sqlite:///{example} (four slashes for an absolute path)")
    elif uri.startswith("sqlite:///") and unquote(uri[len("sqlite:///"):]).split("?")[0] in ("", ":memory:"):
        raise UriError(f"the tracking URI {uri} is an in-memory SQLite store, which ends with the process "
                       "that opened it and cannot be shared with the sweep's jobs: give a file, e.g. "
                       f"sqlite:///{base / 'mlflow.db'}")
    elif uri.startswith("sqlite:///"):
        # the path as SQLAlchemy reads it (percent-escapes decoded), '~' the home folder
        written = unquote(uri[len("sqlite:///"):])
        path = Path(written).expanduser()
        path = path if path.is_absolute() and ".." not in path.parts else (base / path).resolve()
        if bad := next((c for c in "?%" if c in written), None):
            raise UriError(_odd_path(uri, bad, path))
    elif uri.startswith(("http://", "https://", "databricks", "postgresql", "mysql", "mssql")):
        return uri
    elif re.match(r"[A-Za-z][A-Za-z0-9+.-]+://", uri) and not uri.startswith("file:"):
        raise UriError(f"the tracking URI {uri} has a scheme MLflow cannot track to: give sqlite:///PATH "
                       "(a file), http://HOST:PORT (a tracking server) or a database server's URI "
                       "(postgresql://, mysql://)")
    else:
        folder = Path(uri[len("file:"):] if uri.startswith("file:") else uri).expanduser()
        folder = folder if folder.is_absolute() else (base / folder).resolve()
        if (folder / "mlflow.db").is_file():                          # a folder that holds the store
            folder = folder / "mlflow.db"
        if folder.suffix in (".db", ".sqlite", ".sqlite3"):        # the path of a SQLite file
            raise UriError(f"the tracking URI {uri} is a path, which MLflow reads as a file store; as a "
                           f"SQLite store it is sqlite:///{folder}")
        raise UriError(
            f"the tracking URI {uri} is a file store; MLflow 3 keeps runs in a database store. Use a SQLite "
            f"file instead, e.g. sqlite:///{folder.with_name(folder.name + '.db')}, or a tracking server "
            "(http://host:port).")
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(f"the tracking URI {uri}: {_store_problem(path)}") from None
        except OSError:
            pass                                     # named below (also /proc: no folder can be made)
        if (folder := unwritable(path) or unwritable(path.parent)) is not None:
            raise StoreError(f"the store {path} cannot be written: {folder} is read-only for this user "
                             "(SQLite writes the database and its journal beside it, the artifacts go there "
                             "too); give a writable place: tracking.uri=sqlite:////PATH/mlflow.db, or "
                             "MLFLOW_TRACKING_URI")
    return f"sqlite:///{path}"


def unwritable(path: Path) -> Path | None:
    """What keeps this process from writing ``path`` (a file, or a folder to be made): ``path`` when
    it exists and is read-only, else the nearest existing folder above it when that is read-only
    (files cannot be made in it); None when ``path`` can be written or made. A folder counts as
    writable only when a file can be made in it: the superuser passes every permission check, but not
    on a pseudo file system (/proc, /sys), where SQLite and the store's lock would fail or hang."""
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        return None if os.access(path, os.W_OK) else path
    folder = path if path.exists() else next((p for p in path.parents if p.exists()), None)
    if folder is None:
        return None
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-"):
            return None
    except OSError:
        return folder


def _odd_path(uri: str, char: str, path: Path) -> str:
    """Why the SQLite path ``path`` of ``uri``, which holds ``char`` ('?' or '%'), cannot be a store."""
    if "?" in uri:
        why = f"SQLAlchemy ends the path at '?': the store would be {unquote(uri.split('?')[0][len('sqlite:///'):])}"
    else:
        why = ("SQLAlchemy reads '%' as the start of an escape such as %20, and " if char == "%" else "")
        why += f"MLflow makes a stray folder named with %{ord(char):02X} beside the store"
    fixed = str(path).replace("?", "_").replace("%", "_")
    return (f"the tracking URI {uri}: a SQLite store's path cannot hold '{char}' ({why}); use a path "
            f"without '?' and '%', e.g. sqlite:///{fixed}")


def sqlite_path(uri: str) -> Path | None:
    """The database file a ``sqlite:///`` URI names, as SQLAlchemy reads it (the path ends at '?',
    percent-escapes decoded), else None."""
    return Path(unquote(uri[len("sqlite:///"):].split("?", 1)[0])) if uri.startswith("sqlite:///") else None


_LOCKS: dict = {}


def store_lock(uri: str):
    """Inter-process lock of a SQLite store (``<db>.lock``); a no-op for servers, which serialise.

    One lock object per store and process, so that it is re-entrant within the process."""
    db = sqlite_path(uri)
    if db is None:
        return contextlib.nullcontext()
    if uri not in _LOCKS:
        from filelock import FileLock
        _LOCKS[uri] = FileLock(str(db) + ".lock", timeout=600)
    return _LOCKS[uri]


@contextlib.contextmanager
def _uninterrupted():
    """Ctrl-C and SIGTERM wait until the block is done (in the main thread; elsewhere nothing changes):
    MLflow creating a store's tables, cut short, leaves a store that no later command can open. The
    signal's own handler runs after the block (KeyboardInterrupt for Ctrl-C)."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list = []
    old = {sig: signal.signal(sig, lambda num, frame: caught.append(num))
           for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if caught:
            handler = old[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), caught[0])


def _read_only(db: Path):
    """A read-only sqlite3 connection to ``db`` (closed by ``with``); raises sqlite3.Error."""
    import sqlite3
    return contextlib.closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=30))


def _revision(db: Path) -> str | None:
    """The alembic revision of MLflow's schema in the SQLite file ``db`` (read-only), or None (no
    file, no MLflow schema yet, or not readable)."""
    import sqlite3
    if not db.is_file():
        return None
    try:
        with _read_only(db) as con:
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


@functools.lru_cache(maxsize=1)
def _schema_head() -> str:
    """The schema revision of the installed MLflow (the head of its alembic migrations), read once per
    process. MLflow reads it again each time it opens a SQL store (alembic loads its ~70 migration
    scripts: about 0.2 s of CPU); from this first call on, it is handed this one."""
    import mlflow.store.db.utils as db_utils
    head = db_utils._get_latest_schema_revision()
    db_utils._get_latest_schema_revision = lambda: head
    return head


def _cache_folder() -> Path:
    """Where this project keeps files it can make again: ``$XDG_CACHE_HOME/tensorcore-ablations``
    (default, and for a relative ``XDG_CACHE_HOME`` as the XDG specification asks:
    ``~/.cache/tensorcore-ablations``)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "tensorcore-ablations"


def _empty_store_made(path: Path, head: str) -> bool:
    """Whether MLflow made ``path`` whole: schema ``head``, SQLite's ``quick_check`` of every page, no
    experiment in it."""
    import sqlite3
    try:
        with _read_only(path) as con:
            return (con.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
                    and con.execute("PRAGMA quick_check").fetchall() == [("ok",)]
                    and con.execute("SELECT count(*) FROM experiments").fetchone() == (0,))
    except sqlite3.Error:
        return False


def _empty_store_sound(path: Path) -> bool:
    """Whether ``path`` is still the empty store that was made and checked (:func:`_empty_store_made`):
    its sha256 is the one written beside it then (``<name>.sha256``). A damaged page or a row written
    into any table changes it."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == Path(f"{path}.sha256").read_text()
    except OSError:
        return False


def _aside(path: Path) -> Path:
    """A new file beside ``path`` to write in before renaming it to ``path``."""
    fd, aside = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    return Path(aside)


def _empty_store() -> Path | None:
    """A SQLite file with the installed MLflow's schema as MLflow makes it for a new store (its tables
    created, its ~70 alembic migrations run) and no experiment, or None where it cannot be kept.

    MLflow makes a new store's schema by running every migration: about 1 s of CPU per store. This is
    done once per MLflow version, into :func:`_cache_folder` (``mlflow-<version>-<schema head>.db`` and
    its sha256, each written aside and renamed into place, so processes that make it at once each see
    a whole file), and a new store is a copy of it (:func:`_made_from_template`). On opening the copy
    MLflow adds its Default experiment, as it does after making a schema. A file there that is not the
    one made (:func:`_empty_store_sound`: damaged, or written to) is made again, and files left aside
    by killed processes (of any MLflow version, an hour old) are removed."""
    import mlflow
    head = _schema_head()
    try:
        path = _cache_folder() / f"mlflow-{mlflow.__version__}-{head}.db"
        for left in path.parent.glob(".mlflow-*"):
            if time.time() - left.stat().st_mtime > 3600:
                left.unlink()
        if _empty_store_sound(path):
            return path
        from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine
        path.parent.mkdir(parents=True, exist_ok=True)
        made, digest = _aside(path), _aside(Path(f"{path}.sha256"))
        try:
            engine = create_sqlalchemy_engine(f"sqlite:///{made}")
            try:
                _initialize_tables(engine)          # what SqlAlchemyStore does to an empty database
            finally:
                engine.dispose()
            if not _empty_store_made(made, head):
                return None
            digest.write_text(hashlib.sha256(made.read_bytes()).hexdigest())
            os.replace(digest, f"{path}.sha256")
            os.replace(made, path)
        finally:
            for left in (made, digest):
                with contextlib.suppress(OSError):
                    left.unlink()
    except Exception:  # noqa: BLE001 - no home or cache folder, a full disk: MLflow makes the store itself
        return None
    return path


def _made_from_template(db: Path) -> bool:
    """Make the new SQLite store ``db``, a path where nothing is (no file, no link: a file or link that is
    there MLflow sets up itself, keeping its owner and mode), a copy of :func:`_empty_store`, written
    aside and renamed into place. False, leaving nothing at ``db``, where nothing was copied: MLflow then
    makes the schema itself. Raises OSError when the store's disk is full. Called under the store lock,
    so a file left aside here is one a killed process left: it is removed."""
    import shutil
    if (template := _empty_store()) is None:
        return False
    for left in db.parent.glob(f".{db.name}.*.new"):
        with contextlib.suppress(OSError):
            left.unlink()
    aside = db.with_name(f".{db.name}.{os.getpid()}.new")
    try:
        shutil.copyfile(template, aside)
        os.replace(aside, db)
    except OSError as exc:
        with contextlib.suppress(OSError):
            aside.unlink()
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise                                   # MLflow would fail the same way, half-way through
        return False
    return True


def _remove_half_made(uri: str, db: Path) -> None:
    """Remove the store ``db`` whose set-up failed half-way, and MLflow's engine of ``uri``, which
    keeps a connection to the removed file and would show its tables to a later client in this
    process."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    db.unlink()
    with contextlib.suppress(Exception):   # MLflow's cache of engines by URI
        SqlAlchemyStore._engine_map.pop(uri).dispose()


def _schema_known(rev: str) -> bool:
    """Whether the installed MLflow's migrations hold the revision ``rev`` (an older schema)."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config
    try:
        return ScriptDirectory.from_config(_get_alembic_config(db_url="")).get_revision(rev) is not None
    except Exception:  # noqa: BLE001 - alembic's errors for a revision it cannot locate
        return False


def _schema_made(db: Path) -> bool:
    """Whether the SQLite store ``db`` has the installed MLflow's schema (its head revision): then
    clients may open it without the store lock, in parallel, as MLflow changes nothing on open; a new,
    half-made or older store is opened under it."""
    return _revision(db) == _schema_head()


def check_schema(uri: str, write: bool = True) -> bool:
    """Check the schema of the SQLite store of ``uri`` before MLflow opens it (MLflow migrates an
    older store in place on open, after which the MLflow that wrote it cannot open it).

    Returns True when the store has the installed MLflow's schema (also a server's store, left to its
    server), False when it has no schema yet (``write`` only: the caller makes it, under the lock).
    An older schema: with ``write`` the file is first copied to ``<db>.bak-<revision>``, then upgraded
    as ``mlflow db upgrade`` does, under the store lock, and one line says so. Raises StoreError for an
    older schema without ``write`` (a read-only command never changes a store; the message gives the
    command that upgrades it), for a schema of a newer MLflow (the message gives the pip command),
    for no schema without ``write``, and when the copy cannot be made (nothing is changed then).
    """
    import mlflow
    db = sqlite_path(uri)
    if db is None:
        return True
    rev, head = _revision(db), _schema_head()
    if rev != head and not write and Path(f"{db}.lock").is_file():
        with contextlib.suppress(Exception):      # another command may be making or upgrading it now
            with store_lock(uri):
                rev = _revision(db)
    if rev == head:
        return True
    if rev is None:
        if write:
            return False
        raise StoreError(f"{db} is not an MLflow store (no MLflow tables in it; tracking URI {uri}); "
                         "give the URI that run.py printed")
    if not _schema_known(rev):
        raise StoreError(f"{db} was written by a newer MLflow than the installed {mlflow.__version__} (its "
                         f"schema revision {rev} is unknown to this one): pip install "
                         f"'mlflow>{mlflow.__version__}', or open it with the MLflow that wrote it")
    older = (f"{db} was written by an older MLflow (schema revision {rev}; MLflow {mlflow.__version__} "
             f"needs {head})")
    if not write:
        raise StoreError(f"{older}. A read-only command does not upgrade it: any run.py command on it "
                         f"does, keeping a copy of the old file; or copy it yourself and run `mlflow db "
                         f"upgrade sqlite:///{db}`")
    with store_lock(uri), _uninterrupted():
        if (rev := _revision(db)) == head:          # another process upgraded it meanwhile
            return True
        _upgrade(db, rev, older)
    return True


def _upgrade(db: Path, rev: str, older: str) -> None:
    """Copy the store ``db`` of schema ``rev`` beside it, then migrate it to the installed MLflow's
    schema; a failed migration puts the copy back. Raises StoreError when either step fails."""
    import shutil
    import sqlite3

    import sqlalchemy
    from mlflow.store.db.utils import _upgrade_db
    backup = db.with_name(f"{db.name}.bak-{rev}")
    n = 1
    while backup.exists():
        backup, n = db.with_name(f"{db.name}.bak-{rev}.{n}"), n + 1
    try:
        with _read_only(db) as src, contextlib.closing(sqlite3.connect(backup)) as dst:
            src.backup(dst)
    except (OSError, sqlite3.Error) as exc:
        backup.unlink(missing_ok=True)
        raise StoreError(f"{older}; it was not upgraded, as no copy of it could be made at {backup} "
                         f"({exc}): free space there and run the command again") from None
    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    try:
        _upgrade_db(engine)
    except Exception as exc:  # noqa: BLE001 - alembic's and SQLAlchemy's errors
        engine.dispose()
        if _revision(db) != rev:                    # migrated part of the way: back to the copy
            shutil.copyfile(backup, db)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"{older}; upgrading it failed ({first}); the store is left as it was (its copy: "
                         f"{backup})") from None
    engine.dispose()
    print(f"{older}: upgraded in place; the old file is kept as {backup} (the MLflow that wrote it "
          "opens that copy).", flush=True)


def _lock_holder(db: Path) -> str | None:
    """The process holding a lock on the SQLite file ``db`` (``pid N: command``), from /proc/locks
    (Linux; SQLite locks with POSIX advisory locks), or None when it is not known."""
    try:
        inode = db.stat().st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    pids = [f[4] for f in map(str.split, lines)
            if len(f) >= 6 and f[5].rsplit(":", 1)[-1] == str(inode) and f[4] != str(PID)]
    pids.sort(key=lambda pid: not any(f"WRITE {pid} " in line for line in lines))
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = ""
        cmd = " ".join(cmd.split())[:120]            # one line, whatever the command's arguments hold
        return f"pid {pid}" + (f": {cmd}" if cmd else "")
    return None


_FULL = "is full; free space there (or give another tracking.uri)"    # how unavailable ends a full disk


def unavailable(exc: BaseException, db: Path, wait: float) -> str | None:
    """Why the SQLite store ``db`` refused a write, when ``exc`` (or an error inside it) says it was
    locked by another process past ``wait`` seconds or its disk is full; else None."""
    while exc is not None:
        text = str(exc)
        if "database is locked" in text:
            holder = _lock_holder(db)
            who = (f"by another process ({holder})" if holder else
                   f"by another process (not known which: `fuser {db}` lists those that have it open)")
            return (f"the store {db} stayed locked {who} holding a write transaction for {wait:g} s "
                    "(tracking.wait); end that process or let it finish")
        if "database or disk is full" in text or (isinstance(exc, OSError)
                                                   and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
            return f"the disk of the store {db} {_FULL}"
        exc = exc.__cause__ or exc.__context__
    return None


_WAIT_MS: dict = {}       # SQLite database path -> how long its writes wait for another's lock (ms)
MAX_WAIT_S = (2**31 - 1) // 1000    # the longest wait SQLite's busy timeout takes (an int of milliseconds)


def _busy_timeout(conn, cursor, statement, params, context, executemany):
    """MLflow sets SQLite's busy timeout (20 s) at the start of every session: the store's wait
    (``Tracker(wait=...)``) replaces it."""
    if statement.startswith("PRAGMA busy_timeout") and (ms := _WAIT_MS.get(conn.engine.url.database)):
        statement = f"PRAGMA busy_timeout = {ms};"
    return statement, params


def _set_wait(db: Path, seconds: float) -> None:
    """Writes to the SQLite store ``db`` wait up to ``seconds`` for another process's write lock."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    if not event.contains(Engine, "before_cursor_execute", _busy_timeout):
        event.listen(Engine, "before_cursor_execute", _busy_timeout, retval=True)
    _WAIT_MS[str(db)] = max(1, int(min(seconds, MAX_WAIT_S) * 1000))


class _Guarded:
    """An MlflowClient whose calls raise StoreUnavailable (``stop``) or StoreError with one line
    when the SQLite store ``db`` is locked past the wait or its disk is full (MLflow raises these as
    an MlflowException holding SQLAlchemy's error, artifacts as OSError)."""

    def __init__(self, client, db: Path, wait: float, stop: bool):
        self._client, self._db, self._wait, self._stop = client, db, wait, stop

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def call(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                if (why := unavailable(exc, self._db, self._wait)) is None:
                    raise
                raise (StoreUnavailable if self._stop else StoreError)(why) from None
        return call


def _store_problem(db: Path) -> str | None:
    """Why the SQLite path ``db`` cannot be a store, or None: a folder (MLflow retried it for minutes),
    a file among its folders, a file that is not a SQLite database, or a database of another
    application's tables (MLflow would add its own to it). A half-made store has MLflow's tables."""
    import sqlite3
    if db.is_dir():
        return f"{db} is a folder, not a database file: give the file, e.g. sqlite:///{db / 'mlflow.db'}"
    if (file := next((p for p in db.parents if p.exists() and not p.is_dir()), None)) is not None:
        return f"{file} is a file, not a folder"
    if not db.is_file() or db.stat().st_size == 0:
        return None
    try:
        with _read_only(db) as con:
            tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return f"{db} is not a SQLite database"
    if tables and not tables & {"alembic_version", "experiments", "runs"}:
        return (f"{db} holds {len(tables)} table(s) of another application and none of MLflow's; give a new "
                "file for the store")
    return None


def flatten(cfg, prefix: str = "") -> dict:
    """Dotted scalar params of a config: lists become their string form (``tile.block`` -> '[128, 128]')."""
    from omegaconf import DictConfig, OmegaConf
    data = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True) if isinstance(cfg, DictConfig) else cfg
    out = {}
    for key, val in data.items():
        name = f"{prefix}{key}"
        if isinstance(val, dict):
            out.update(flatten(val, name + "."))
        else:
            out[name] = "null" if val is None else str(val)
    return out


def run_key(*parts) -> str:
    """Identity of a measurement: a hash of everything that changes its result (the kernel's spec
    and PTX, the size, GPU, driver, toolchain versions, timing and verification settings)."""
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:24]


def process_ended(host: str, pid: str) -> bool:
    """Whether the process ``pid`` (text) on ``host`` is known to have ended: only a process of this
    host can be looked up (no process has that pid); one of another host, or one this user may not
    signal, is not known to have ended."""
    if host != HOST or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return False


def stale(run, stale_after: float = STALE_AFTER_S, now: float | None = None) -> str | None:
    """Why the RUNNING run ``run`` (an mlflow Run) has no live process any more, or None while it may
    still run: its process on this host is gone, or its heartbeat (tag ``heartbeat_unix``, refreshed
    by its process; a run without one: its start) is older than ``stale_after`` seconds, which also
    covers a process on another host that was killed or whose node failed. The hosts' clocks are
    compared: keep them in step (NTP) well within ``stale_after``."""
    tags = run.data.tags
    host, pid = tags.get("owner_host", "?"), tags.get("owner_pid", "")
    if process_ended(host, pid):
        return f"its process (pid {pid} on {host}) ended without closing it"
    try:
        beat = float(tags[HEARTBEAT])
    except (KeyError, ValueError):
        beat = run.info.start_time / 1000
    age = (time.time() if now is None else now) - beat
    if age <= stale_after:
        return None
    return (f"no heartbeat from its process (pid {pid or '?'} on {host}) for {age:.0f} s, more than "
            f"tracking.stale_after_s={stale_after:g}: the process or its node ended without closing it")


def claim_marker(experiment_id: str, key: str, n: int) -> str:
    """The name of the marker experiment of the ``n``-th claim (0, 1, ...) of run key ``key`` in the
    experiment ``experiment_id``: ``.claims/<experiment id>/<key>/<n>``.

    Why a claim is atomic on every store: experiment names are unique in MLflow's database schema
    (a UNIQUE constraint, in SQLite, PostgreSQL and MySQL alike), and ``create_experiment`` inserts the
    row in one transaction, so of any number of processes, on any hosts, creating the same name at
    once, the database lets exactly one insert succeed and the others get RESOURCE_ALREADY_EXISTS
    (directly, or through a tracking server, which passes the store's error on). A claimant that wins
    marker ``n`` starts the run (tag ``claim`` = n); claim ``n + 1`` may only be tried once claim ``n``
    is spent: its run ended (FAILED, KILLED, or under a deleted parent), or it has no run and its claimant
    died in between: its process on this host has ended, or ``stale_after`` seconds have passed since
    the marker was made. Markers are deleted at once (hidden in the UI; a deleted name stays taken
    until ``mlflow gc``)."""
    return f"{CLAIMS}/{experiment_id}/{key}/{n}"


def check_server(uri: str, timeout: float = 10.0, option: str = "tracking.uri") -> None:
    """Raise StoreError at once when no MLflow tracking server answers at ``uri`` (GET ``/health``
    within ``timeout`` seconds; MLflow's own client would retry for minutes). ``option``: the command's
    option that gives the URI, named in the error."""
    import urllib.error
    import urllib.request
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).close()
    except (urllib.error.URLError, OSError) as exc:
        raise StoreError(f"no MLflow tracking server answers at {uri} ({exc}); start one "
                         f"(mlflow server --host HOST --port PORT --backend-store-uri ...) or give "
                         f"another {option}") from None


def _client(mlflow, uri: str, experiment: str):
    """An MlflowClient of ``uri`` and the experiment named ``experiment`` (None when absent). Raises
    StoreError when a database server's URI lacks its Python driver or no database answers there."""
    try:
        client = mlflow.MlflowClient(tracking_uri=uri)
        return client, client.get_experiment_by_name(experiment)
    except Exception as exc:
        if not uri.startswith(("postgresql", "mysql", "mssql")):
            raise
        shown = re.sub(r"//[^@/]*@", "//", uri)            # without the user and password
        if isinstance(exc, ImportError):
            name = exc.name or str(exc)
            package = {"psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary",
                       "MySQLdb": "mysqlclient"}.get(name, name)
            raise StoreError(f"the tracking URI {shown} needs the database driver {name}, which is not "
                             f"installed: pip install {package}, or name an installed driver in the URI "
                             "(e.g. postgresql+psycopg2://, mysql+pymysql://)") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(f"no database answers at {shown}: {first}") from None   # SQLAlchemy's errors


RUN_NAME_LENGTH = 250      # MLflow's SQL stores keep a run's name in 250 characters
_WARNED: set = set()       # names of values said to be longer than MLflow keeps, once per process


def _fit(values: dict, limit: int) -> tuple[dict, dict]:
    """(``values`` as strings, each longer than ``limit`` characters (MLflow's limit of a param or tag
    value) cut to its start and a pointer to the artifact that keeps it; name -> whole value of those)."""
    from .record import ARTIFACTS
    fitted, whole = {}, {}
    for key, v in values.items():
        text = str(v)
        if len(text) > limit:
            whole[key] = text
            pointer = f" ... [{len(text)} characters; whole: artifact {ARTIFACTS['long_value'].format(key)}]"
            text = text[:limit - len(pointer)] + pointer
        fitted[key] = text
    return fitted, whole


class Tracker:
    """This project's run structure on one MLflow experiment (``mlflow.MlflowClient`` underneath).

    ``create=False`` opens an existing store and experiment only (for read-only commands). ``wait``:
    seconds a write waits for another process's write transaction on a SQLite store. ``stale_after``:
    seconds without a heartbeat after which a RUNNING run counts as abandoned (:func:`stale`); the
    runs this process has open get a heartbeat every tenth of it. ``restore=True``
    (a job of a sweep that started in the experiment) restores a deleted experiment, as
    :meth:`keep_live` does.
    Raises StoreError when the store does not exist or is no MLflow store (``create=False``), has the
    schema of another MLflow (:func:`check_schema`), or the experiment was deleted (unless
    ``restore``). Once opened, its client raises StoreUnavailable (``create``; StoreError otherwise)
    when a SQLite store stays locked past ``wait`` or its disk is full.
    """

    def __init__(self, uri: str, experiment: str, create: bool = True, wait: float = STORE_WAIT_S,
                 restore: bool = False, stale_after: float = STALE_AFTER_S):
        import logging

        import mlflow
        logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)  # a new store's set-up notes
        # MLflow notes a new store's set-up and logs each database error with its traceback before
        # raising it; the commands report the error in one line
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        db = sqlite_path(uri)
        if db is not None and (why := _store_problem(db)) is not None:
            raise StoreError(f"{why} (tracking URI {uri})")
        if not create and db is not None and not db.is_file():
            hint = "give the URI that run.py printed"
            with contextlib.suppress(ValueError):      # sqlite:///tmp/x.db is tmp/x.db under this folder
                absolute = Path("/") / db.relative_to(Path.cwd())
                if absolute.is_file():
                    hint = f"an absolute path takes four slashes: sqlite:///{absolute}"
            raise StoreError(f"no store at {db} (tracking URI {uri}); {hint}")
        made = db is not None and check_schema(uri, write=create)     # read-only: never set one up
        if db is not None:
            _set_wait(db, wait)
        guard = (lambda c: _Guarded(c, db, wait, create)) if db is not None else (lambda c: c)  # noqa: E731
        if uri.startswith(("http://", "https://")):
            check_server(uri)
            # MLflow prints a link of its own for each run it ends on a server; the sweep prints its links
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.uri, self.experiment, self.open = uri, experiment, set()
        self.stale_after = float(stale_after)
        self.done: set = set()      # ids of the FINISHED runs this process ended or claim found done
        self.parents: dict = {}     # sweep key -> parent run id, as found or created by this process
        self.reused: set = set()    # ids of runs of other sweeps that claim found measured (join)
        self._long: dict = {}       # run id -> names of its values kept whole as artifacts (_keep_whole)
        self.finished = 0
        # the first client of a new store makes its schema, under the lock; a store that has this
        # MLflow's schema is opened without it (the job processes of a parallel sweep open it at once),
        # and should that fail, under the lock after all
        exp, locked, opened = None, create, False
        if made:
            try:
                self.client = guard(mlflow.MlflowClient(tracking_uri=uri))
                exp = self.client.get_experiment_by_name(experiment)
                opened, locked = True, exp is None and create   # a new experiment: under the lock
            except Exception:  # noqa: BLE001 - opened again under the lock
                pass
        with store_lock(uri) if locked else contextlib.nullcontext(), \
                _uninterrupted() if db is not None and not made else contextlib.nullcontext():
            if locked or not opened:
                new = db is not None and not made and not os.path.lexists(db)
                try:
                    if new:
                        _made_from_template(db)
                    client, exp = _client(mlflow, uri, experiment)
                except Exception as exc:
                    if db is None or (why := unavailable(exc, db, wait)) is None:
                        raise
                    if new and why.endswith(_FULL) and db.is_file() and not _schema_made(db):
                        _remove_half_made(uri, db)  # the same command makes it again
                    raise (StoreUnavailable if create else StoreError)(why) from None
                self.client = guard(client)
            if exp is None and not create:
                names = [e.name for e in self.client.search_experiments()]
                raise StoreError(f"experiment {experiment!r} is not in {uri}; it holds: "
                                 + (", ".join(names) or "no experiment"))
            if exp is None:
                artifacts = (db.parent / "artifacts").as_uri() if db else None
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=artifacts)
            elif exp.lifecycle_stage == "deleted" and not (restore and create):
                raise StoreError(
                    f"experiment {experiment!r} (id {exp.experiment_id}) in {uri} was deleted. Restore it "
                    f"with: MLFLOW_TRACKING_URI={shlex.quote(uri)} mlflow experiments restore "
                    f"--experiment-id {exp.experiment_id} ; or use another experiment name (run.py: "
                    "tracking.experiment=NAME; the report and profile commands: --experiment NAME).")
            else:
                self.experiment_id = exp.experiment_id
                if exp.lifecycle_stage == "deleted":
                    self.keep_live(None)
                if db is not None and create:         # a read-only command changes nothing
                    self._relocate(exp, db)

    def _relocate(self, exp, db: Path) -> None:
        """A SQLite store moved to another folder keeps its artifacts beside the database: point the
        experiment's and its runs' artifact URIs at ``<db folder>/artifacts`` (MLflow stores them
        absolute, so new artifacts would otherwise go to the old folder)."""
        from urllib.parse import unquote, urlparse
        new = (db.parent / "artifacts").as_uri()
        old = exp.artifact_location
        if old == new or not old.startswith("file://") or not old.endswith("/artifacts") \
                or not (db.parent / "artifacts").is_dir():
            return
        if Path(unquote(urlparse(old).path)).resolve() == (db.parent / "artifacts").resolve():
            return                          # the same folder, named through a link or with '..'
        import sqlite3
        with sqlite3.connect(db) as con:
            con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
                        (new, int(exp.experiment_id)))
            con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                        "WHERE experiment_id = ? AND artifact_uri LIKE ? || '%'",
                        (new, len(old) + 1, int(exp.experiment_id), old))
        print(f"The store moved from {old[len('file://'):-len('/artifacts')]} to {db.parent}: "
              "artifact locations updated.", flush=True)

    # -- runs ---------------------------------------------------------------------------------
    def start(self, name: str, params: dict, tags: dict, parent: str | None = None) -> str:
        """Create a RUNNING run with params and tags, owned by this process; returns its run id."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH
        tags, long_tags = _fit({k: str(v) for k, v in tags.items()}, MAX_TAG_VAL_LENGTH)
        tags.update(OWNER, **{HEARTBEAT: f"{time.time():.0f}"})
        if parent:
            self.keep_live(parent)
            tags.update({"mlflow.parentRunId": parent, MEMBER.format(parent): NEW})
        if len(name) > RUN_NAME_LENGTH:         # a label: the values it is made of are params or tags
            name = name[:RUN_NAME_LENGTH - 3] + "..."
        rid = self.client.create_run(self.experiment_id, run_name=name, tags=tags).info.run_id
        self.open.add(rid)
        _heartbeat(self)
        params, long_params = _fit(params, MAX_PARAM_VAL_LENGTH)
        items = [Param(k[:250], v) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(rid, params=items[i:i + 100])
        self._keep_whole(rid, long_tags, "tag")
        self._keep_whole(rid, long_params, "param")
        return rid

    def _keep_whole(self, rid: str, whole: dict, kind: str) -> None:
        """Log each value of ``whole`` (name -> text longer than MLflow keeps, see :func:`_fit`) as the
        artifact ``long_values/<name>.txt`` of run ``rid``, list the names in its tag ``long_values``
        and say so once per name and process."""
        if not whole:
            return
        from .record import ARTIFACTS
        for key, text in whole.items():
            self.client.log_text(rid, text, ARTIFACTS["long_value"].format(key))
            if (kind, key) not in _WARNED:
                _WARNED.add((kind, key))
                print(f"Note: {kind} {key} is {len(text):,} characters, longer than MLflow keeps: the {kind} "
                      f"holds its start, the whole value is the run's artifact "
                      f"{ARTIFACTS['long_value'].format(key)} (tag long_values lists such names).",
                      flush=True)
        names = self._long.setdefault(rid, set())
        names.update(whole)
        self.client.set_tag(rid, "long_values", ", ".join(sorted(names)))

    def keep_live(self, parent: str | None) -> None:
        """Restore the experiment and the sweep's parent run ``parent`` when they were deleted (in the
        MLflow UI, say) while the sweep runs, and say so: its runs are never added to, or left under, a
        deleted run, and the link it prints leads to a live one. Delete them again once it has ended."""
        exp = self.client.get_experiment(self.experiment_id)
        if exp.lifecycle_stage == "deleted":         # its runs were deleted with it, and come back with it
            self.client.restore_experiment(self.experiment_id)
            print(f"Experiment {exp.name!r} (id {self.experiment_id}) was deleted while this sweep ran: "
                  "restored it with its runs, so that the sweep's runs stay under a live parent; delete "
                  "it once the sweep has ended.", flush=True)
        if parent and self.client.get_run(parent).info.lifecycle_stage == "deleted":
            self.client.restore_run(parent)
            print(f"Parent run {parent} of this sweep was deleted while the sweep ran: restored it, so "
                  "that the sweep's runs stay under a live parent; delete it once the sweep has ended.",
                  flush=True)

    def log(self, rid: str, metrics: dict | None = None, tags: dict | None = None,
            series: dict | None = None) -> None:
        """Log finite numeric metrics (inf/NaN are dropped, never logged) and string tags; ``series``:
        metric name -> list of values, logged as MLflow steps 0, 1, ..."""
        from mlflow.entities import Metric, RunTag
        from mlflow.utils.validation import MAX_TAG_VAL_LENGTH
        now = int(time.time() * 1000)
        steps = [(k, v, 0) for k, v in (metrics or {}).items()]
        steps += [(k, v, i) for k, values in (series or {}).items() for i, v in enumerate(values)]
        ms = [Metric(k, float(v), now, step) for k, v, step in steps
              if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)]
        tags, whole = _fit(tags or {}, MAX_TAG_VAL_LENGTH)
        ts = [RunTag(k, v) for k, v in tags.items()]
        for i in range(0, max(len(ms), len(ts), 1), 200):
            self.client.log_batch(rid, metrics=ms[i:i + 200], tags=ts[i:i + 200])
        self._keep_whole(rid, whole, "tag")

    def artifact_text(self, rid: str, text: str, name: str) -> None:
        self.client.log_text(rid, text, name)

    def artifact_file(self, rid: str, path: str | Path) -> None:
        self.client.log_artifact(rid, str(path))

    def end(self, rid: str, status: str = "FINISHED", reason: str | None = None) -> None:
        """Terminate a run: FINISHED (a skipped run's ``reason`` as tag ``skip_reason``), FAILED
        (``reason`` as tag ``error``) or KILLED (``reason`` as tag ``skip_reason``)."""
        if reason:
            self.log(rid, tags={"error" if status == "FAILED" else "skip_reason": reason})
        self.client.set_terminated(rid, status)
        self.open.discard(rid)
        self.finished += status == "FINISHED"
        if status == "FINISHED":
            self.done.add(rid)

    def _runs(self, filter_string: str, max_results: int = 1000) -> list:
        return self.client.search_runs([self.experiment_id], filter_string=filter_string,
                                       max_results=max_results)

    def claim(self, key: str, name: str, params: dict, tags: dict, parent) -> tuple[str, str]:
        """Start the run of measurement ``key`` unless it is done or under way elsewhere.

        ``parent`` is a callable returning the parent run id (called only when a run is created or
        joins the sweep). A run whose parent run was deleted is not reused: it is measured anew.
        Returns ("done", id) for a FINISHED run, ("busy", id) for a RUNNING run with a live heartbeat
        (or one being started: id is then the claimant's ``host:pid``), or ("new", id) for a run started
        here. A done or busy run of another sweep joins this one as reused (:meth:`join`; its id is then
        in :attr:`reused`). A RUNNING run without a live process (:func:`stale`) is closed as KILLED
        first. At most one claimant wins, however many processes on however many hosts ask at once:
        the run is started only by the one that creates the next claim marker (:func:`claim_marker`).
        """
        with store_lock(self.uri):
            for _ in range(5):
                if (found := self._measured(key, parent)) is not None:
                    return found[0], found[1].info.run_id
                n, holder = self._next_claim(key)
                if holder != "":                  # "": marker n-1's run appeared meanwhile: look again
                    break
            if holder is not None:
                return "busy", holder
            rid = self.start(name, params, {**tags, "run_key": key, "claim": str(n)}, parent())
            if self._marker(key, n + 1) is not None:     # taken as abandoned meanwhile: not ours any more
                self.end(rid, "KILLED", "another process took over this claim (it waited past "
                                        f"tracking.stale_after_s={self.stale_after:g} for this run)")
                return "busy", "another process"
            return "new", rid

    def finished_run(self, key: str, parent=lambda: None):
        """The FINISHED run of measurement ``key`` (an mlflow Run; not one of a deleted sweep), joined to
        the sweep ``parent()`` (a callable; None: none) as :meth:`claim` joins it, or None (none, or one
        under way: :meth:`claim` decides then). Lets a runner skip building a kernel whose runs are
        measured already; only :meth:`claim` starts a run."""
        with store_lock(self.uri):
            found = self._measured(key, parent)
        return found[1] if found is not None and found[0] == "done" else None

    def _measured(self, key: str, parent) -> tuple[str, object] | None:
        """("done", run) or ("busy", run) for a FINISHED or live RUNNING run of ``key`` (an mlflow Run; it
        joins the sweep ``parent()``), else None; a RUNNING run without a live process is closed on the
        way."""
        for r in self._runs(f"tags.run_key = '{key}'"):
            if self._parent_deleted(r):     # deleted with its sweep: not a measurement to reuse
                continue
            r = self._settled(r)
            if r.info.status == "RUNNING" and (why := stale(r, self.stale_after)):
                self._close_orphan(r.info.run_id, why)
            elif r.info.status in ("FINISHED", "RUNNING"):
                if (sweep := parent()) and self.join(r, sweep) is not None:
                    self.reused.add(r.info.run_id)
                if r.info.status == "FINISHED":
                    self.done.add(r.info.run_id)
                    return "done", r
                return "busy", r
        return None

    def _settled(self, run):
        """``run`` (an mlflow Run) as its process left it, where :func:`stale` finds that process gone:
        read again after that finding, so that a run the process ended between the first read and its
        end (FINISHED, say) is not taken for an orphan and measured again."""
        if run.info.status == "RUNNING" and stale(run, self.stale_after):
            return self.client.get_run(run.info.run_id)
        return run

    def _marker(self, key: str, n: int):
        """The marker experiment of claim ``n`` of ``key`` (an mlflow Experiment), or None."""
        from mlflow.exceptions import MlflowException
        with contextlib.suppress(MlflowException):
            return self.client.get_experiment_by_name(claim_marker(self.experiment_id, key, n))
        return None

    def _next_claim(self, key: str) -> tuple[int, str | None]:
        """Try to take the next claim of ``key`` (whose runs were just found neither FINISHED nor live).
        Returns (n, None) when this process created marker ``n``; (n, "") when the run of the last
        claim is FINISHED or live after all (made since it looked: look again); else (n, the holder,
        ``host:pid``)."""
        from mlflow.entities import ViewType
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
        prefix = claim_marker(self.experiment_id, key, 0)[:-1]
        markers = {e.name[len(prefix):]: e for e in self.client.search_experiments(
            view_type=ViewType.ALL, filter_string=f"name LIKE '{prefix}%'", max_results=50000)}
        n = max((int(k) for k in markers if k.isdigit()), default=-1) + 1
        if n:
            last = markers[str(n - 1)]
            # whether its claimant ended, before its runs are read: a run it made before it ended is seen
            ended = process_ended(last.tags.get("owner_host", "?"), last.tags.get("owner_pid", ""))
            claimed = [self._settled(r)
                       for r in self._runs(f"tags.run_key = '{key}' and tags.claim = '{n - 1}'")]
            if any(r.info.status == "FINISHED"
                   or r.info.status == "RUNNING" and not stale(r, self.stale_after)
                   for r in claimed if not self._parent_deleted(r)):
                return n - 1, ""
            if not claimed and time.time() - last.creation_time / 1000 <= self.stale_after and not ended:
                return n - 1, _holder(last)          # its claimant is starting the run now
        me = f"{HOST}:{PID}:{threading.get_ident()}:{time.time_ns()}"
        try:
            mid = self.client.create_experiment(claim_marker(self.experiment_id, key, n),
                                                tags={"claimant": me, **OWNER})
        except MlflowException as exc:
            if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
            won = self._marker(key, n)              # our own create, retried by the client, counts
            if won is None or won.tags.get("claimant") != me:
                return n, _holder(won) if won is not None else "another process"
            mid = won.experiment_id
        with contextlib.suppress(MlflowException):  # hidden from the UI; its name stays taken
            self.client.delete_experiment(mid)
        return n, None

    def _parent_deleted(self, run) -> bool:
        """Whether the MLflow parent run of ``run`` (an mlflow Run) was deleted (or is gone)."""
        pid = run.data.tags.get("mlflow.parentRunId")
        if not pid:
            return False
        from mlflow.exceptions import MlflowException
        try:
            return self.client.get_run(pid).info.lifecycle_stage == "deleted"
        except MlflowException:
            return True

    def join(self, run, parent: str) -> bool | None:
        """Make ``run`` (an mlflow Run) a member of the sweep ``parent`` that reused it: tag
        ``in_sweep.<parent>`` = reused, once (a sweep run again counts a run once). Returns True when
        it joined now, False when that sweep reused it before, None when it is the sweep's own run."""
        tags = run.data.tags
        if tags.get("mlflow.parentRunId") == parent:
            return None
        if MEMBER.format(parent) in tags:
            return False
        self.client.set_tag(run.info.run_id, MEMBER.format(parent), REUSED)
        return True

    def parent(self, sweep: dict) -> str:
        """The sweep's parent run: found by ``sweep['key']`` (and reopened) or created, under the lock.

        ``sweep`` holds key, name, jobs, overrides and values (strings) as
        :func:`experiments.runner.sweep.sweep_info` gives them (values: tag ``sweep_values`` where not empty).
        The id is remembered for later jobs of this process.
        """
        if sweep["key"] in self.parents:
            return self.parents[sweep["key"]]
        with store_lock(self.uri):
            found = self._runs(f"tags.sweep_key = '{sweep['key']}' and tags.kind = 'sweep'", 1)
            if found:
                rid = found[0].info.run_id
                if found[0].info.status != "RUNNING":
                    self.client.update_run(rid, status="RUNNING")
                if "skip_reason" in found[0].data.tags:      # an earlier interruption, now resumed
                    self.client.delete_tag(rid, "skip_reason")
                self.open.add(rid)
                self.log(rid, tags={**OWNER, HEARTBEAT: f"{time.time():.0f}", "jobs": sweep["jobs"]})
                _heartbeat(self)
            else:
                values = {"sweep_values": sweep["values"]} if sweep.get("values") else {}
                rid = self.start(sweep["name"], {}, {"kind": "sweep", "sweep_key": sweep["key"],
                                                     "jobs": sweep["jobs"], "overrides": sweep["overrides"],
                                                     **values})
        self.parents[sweep["key"]] = rid
        return rid

    def find_parent(self, key: str) -> str | None:
        """Id of the parent run with sweep key ``key``, or None."""
        found = self._runs(f"tags.sweep_key = '{key}' and tags.kind = 'sweep'", 1)
        return found[0].info.run_id if found else None

    def children(self, parent: str) -> list:
        """Child runs of ``parent`` (mlflow Run objects): the runs the sweep made, not those it reused."""
        return self._runs(f"tags.mlflow.parentRunId = '{parent}'", 50000)

    def sweep_runs(self, parent: str, where: str = "") -> list:
        """The runs of the sweep ``parent`` in this experiment, reused ones included (:func:`sweep_runs`)."""
        return sweep_runs(self.client, [self.experiment_id], parent, where)

    def close_stale(self) -> int:
        """Close (KILLED) the RUNNING runs of the experiment that have no live process any more
        (:func:`stale`: on this host or, by their heartbeat, on any); returns how many."""
        n = 0
        with store_lock(self.uri):
            for r in self._runs("attributes.status = 'RUNNING'", 50000):
                if r.info.run_id not in self.open and (why := stale(r, self.stale_after)):
                    self._close_orphan(r.info.run_id, why)
                    n += 1
        return n

    def _close_orphan(self, rid: str, why: str) -> None:
        self.log(rid, tags={"skip_reason": why, "outcome": "interrupted",
                            "mlflow.note.content": f"Not finished: {why}."})
        self.client.set_terminated(rid, "KILLED")

    def beat(self) -> None:
        """Refresh the heartbeat of every run this process has open (errors of the store ignored:
        the next beat tries again)."""
        from mlflow.entities import RunTag
        now = f"{time.time():.0f}"
        for rid in list(self.open):
            with contextlib.suppress(Exception, StoreUnavailable):
                self.client.log_batch(rid, tags=[RunTag(HEARTBEAT, now)])


def _holder(marker) -> str:
    """Who holds a claim: ``host:pid`` of its marker experiment."""
    return f"{marker.tags.get('owner_host', '?')}:{marker.tags.get('owner_pid', '?')}"


_BEATING: "weakref.WeakSet" = weakref.WeakSet()       # the Trackers whose open runs get heartbeats
_BEAT_LOCK = threading.Lock()
_BEAT_WAKE = threading.Event()      # set when a Tracker joins: its interval may be shorter than the wait


def _heartbeat(tracker: Tracker) -> None:
    """Give the open runs of ``tracker`` a heartbeat from now on: one daemon thread per process beats
    for every Tracker, every tenth of the shortest ``stale_after`` (at most every 30 s). A Tracker that
    joins wakes the thread, so its first beat does not wait out an interval chosen before it."""
    with _BEAT_LOCK:
        _BEATING.add(tracker)
        _BEAT_WAKE.set()
        if any(t.name == "heartbeat" for t in threading.enumerate()):
            return

        def loop() -> None:
            last = time.monotonic()
            while True:
                _BEAT_WAKE.clear()
                every = min([30.0] + [t.stale_after / 10 for t in list(_BEATING)])
                if time.monotonic() - last >= every:
                    last = time.monotonic()
                    for t in list(_BEATING):
                        t.beat()
                _BEAT_WAKE.wait(max(0.0, last + every - time.monotonic()))
        threading.Thread(target=loop, daemon=True, name="heartbeat").start()


def sweep_runs(client, experiment_ids: list, parent: str, where: str = "") -> list:
    """Every run of the sweep ``parent`` (a parent run id) in ``experiment_ids``: the runs it made and
    those it reused (tag ``in_sweep.<parent>``), also runs tracked before that tag existed (found by
    ``mlflow.parentRunId``); each once, oldest first, never the parent itself.

    ``client``: an ``mlflow.MlflowClient``; ``where``: an MLflow filter the runs must also match
    (e.g. ``"tags.outcome = 'verified'"``). Every reader of a sweep's runs (reports, the analysis, the
    profile step, the UI's view of the sweep, the parent's summary) selects them here.
    Raises MlflowException for a ``where`` MLflow cannot parse."""
    extra = f" and {where}" if where else ""
    found = {}
    for by in (f"tags.`{MEMBER.format(parent)}` LIKE '%'", f"tags.mlflow.parentRunId = '{parent}'"):
        for r in client.search_runs(experiment_ids, by + extra, max_results=50000):
            found.setdefault(r.info.run_id, r)
    return sorted((r for r in found.values() if r.info.run_id != parent),
                  key=lambda r: (r.info.start_time, r.info.run_id))


def sweeps_of(run) -> set:
    """The parent run ids of the sweeps ``run`` belongs to: its parent and the sweeps that reused it."""
    tags = run.data.tags
    prefix = MEMBER.format("")
    own = {tags["mlflow.parentRunId"]} if tags.get("mlflow.parentRunId") else set()
    return own | {k[len(prefix):] for k in tags if k.startswith(prefix)}


_TRACKERS: dict = {}     # one Tracker per (store, experiment) and process: jobs share its connection


def trackers() -> list:
    """The Trackers this process has opened."""
    return list(_TRACKERS.values())


def get_tracker(uri: str, experiment: str, wait: float = STORE_WAIT_S, restore: bool = False,
                stale_after: float = STALE_AFTER_S) -> Tracker:
    """The process's Tracker for (store, experiment), created on first use (``wait``, ``restore``,
    ``stale_after``: see Tracker)."""
    if (uri, experiment) not in _TRACKERS:
        _TRACKERS[(uri, experiment)] = Tracker(uri, experiment, wait=wait, restore=restore,
                                               stale_after=stale_after)
    return _TRACKERS[(uri, experiment)]


def close_runs_of_ended_processes() -> int:
    """In every store this process opened, close (KILLED) the RUNNING runs whose process has ended
    (the job processes of a parallel launcher, once ended on Ctrl-C; :func:`stale`); returns how many.
    Errors of an unreachable store are ignored."""
    n = 0
    for tr in _TRACKERS.values():
        with contextlib.suppress(Exception, StoreUnavailable):
            n += tr.close_stale()
    return n


def abort_open_runs(status: str, reason: str) -> tuple[int, int, int]:
    """End every run this process started and has not ended (children first, then parents; a parent
    without children is deleted instead, so no empty parent stays).

    Returns (measurement runs ended, sweep parents ended, runs FINISHED by this process before). Used
    on Ctrl-C, SIGTERM, crashes and an unavailable store, so that no run is left RUNNING; errors of an
    unreachable store are ignored, and a store that stays unavailable is given up at its first refusal
    (its runs stay in ``Tracker.open``, RUNNING until the next command on it closes them).
    """
    ended = sweeps = finished = 0
    for tr in _TRACKERS.values():
        parents = set(tr.parents.values())
        try:        # the runs of this command's sweeps, also those its job processes finished
            finished += max(tr.finished, sum(r.info.status == "FINISHED" and r.info.start_time >= START_MS
                                             for p in parents & tr.open for r in tr.children(p)))
        except (Exception, StoreUnavailable):  # noqa: BLE001 - an unreachable store
            finished += tr.finished
        for rid in sorted(tr.open, key=lambda r: r in parents):
            try:
                if rid in parents and not tr.sweep_runs(rid):
                    tr.end(rid, "KILLED", "no run joined this sweep")
                    tr.client.delete_run(rid)
                    continue
                if rid not in parents:
                    tr.log(rid, tags={"outcome": "interrupted" if status == "KILLED" else "failed",
                                      "mlflow.note.content": f"Not finished: {reason}."})
                tr.end(rid, status, reason)
                if rid in parents:
                    sweeps += 1
                else:
                    ended += 1
            except StoreUnavailable:
                break
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
    return ended, sweeps, finished


def current_sweep() -> dict:
    """The sweep identity the callback exported, for a job (key, name, jobs, overrides, parent)."""
    info = {k: os.environ.get(env) for k, env in SWEEP_ENV.items()}
    if not info["key"]:
        raise RuntimeError("no sweep identity in the environment: run jobs through run.py, whose "
                           "config registers experiments.runner.sweep.SweepCallback")
    return info
