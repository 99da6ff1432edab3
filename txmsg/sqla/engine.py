"""Engines configured for what transactional messages need from a database.

Why a helper at all: the record-backed check and the idempotent consumer are only correct when
concurrent transactions behave predictably, and both SQLite and PostgreSQL need a setting or two
for that.

SQLite (the default)
    * ``journal_mode=WAL``: readers (check-backs) never block the writer and see the last committed
      state, so a check during a running business transaction reads the in-flight marker.
    * ``busy_timeout``: a writer waits for the single write lock instead of failing at once.
    * ``BEGIN IMMEDIATE`` for every transaction (pysqlite's own implicit BEGIN is switched off):
      a deferred transaction that reads and then writes can fail with ``SQLITE_BUSY_SNAPSHOT``
      without ever consulting the busy timeout; taking the write lock up front turns that into a
      plain wait.  Read-only work can ask for ``BEGIN DEFERRED`` with the execution option
      ``{SQLITE_BEGIN_OPTION: "DEFERRED"}`` (see :func:`read_only`).  Consequence: keep slow
      calls (a payment gateway ...) *before* the first statement of a business transaction, or the
      write lock is held for their duration.

PostgreSQL (psycopg 3, ``postgresql+psycopg://``)
    * ``READ COMMITTED`` (the server default) is all the layer needs: records and dedup rows are
      guarded by primary keys and conditional ``UPDATE ... WHERE state = 'IN_FLIGHT'`` statements,
      which PostgreSQL re-evaluates after waiting for a concurrent writer.  ``REPEATABLE READ`` or
      ``SERIALIZABLE`` also work but may raise serialization failures that the caller must retry
      (the framework turns an exception in ``execute_local`` into ROLLBACK or UNKNOW, and in a
      consumer into a redelivery, so nothing is lost).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy import create_engine as _sa_create_engine
from sqlalchemy.engine import URL, AdaptedConnection, Connection, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import PoolResetState

from txmsg.errors import ConfigError
from txmsg.sqla.ping import PING_AFTER_IDLE, install_idle_ping

SQLITE_BEGIN_OPTION = "txmsg_sqlite_begin"
"""Connection execution option naming the SQLite BEGIN flavour (DEFERRED/IMMEDIATE/EXCLUSIVE)."""

_BEGIN_MODES = ("DEFERRED", "IMMEDIATE", "EXCLUSIVE")

SessionFactory = Callable[[], Session]
"""Anything that returns a new :class:`~sqlalchemy.orm.Session` (a ``sessionmaker`` is one)."""


def create_engine(
    url: str | URL,
    *,
    sqlite_busy_timeout_ms: int = 30_000,
    sqlite_begin: str = "IMMEDIATE",
    sqlite_synchronous: str = "NORMAL",
    pre_ping_after_idle: float | None = PING_AFTER_IDLE,
    **kwargs: Any,
) -> Engine:
    """Create an engine tuned as the module docstring explains.

    ``url`` is any SQLAlchemy URL; for a SQLite file its folder is created.  Extra keyword
    arguments go to :func:`sqlalchemy.create_engine`.  ``pre_ping_after_idle``: a server
    database's pooled connection idle that many seconds is pinged before use (a dead one is
    replaced; :mod:`txmsg.sqla.ping`); None pings at every checkout (``pool_pre_ping=True``,
    also what an explicit ``pool_pre_ping`` argument chooses).

    Raises:
        ConfigError: an unknown ``sqlite_begin`` mode or a negative ``pre_ping_after_idle``.
    """
    sa_url = make_url(url)
    if sa_url.get_backend_name() == "postgresql" and sa_url.drivername == "postgresql":
        # psycopg 3 is the driver the project installs; psycopg2 usually is not.
        sa_url = sa_url.set(drivername="postgresql+psycopg")
    if sa_url.get_backend_name() != "sqlite":
        idle_ping = server_pool_options(kwargs, pre_ping_after_idle)
        engine = _sa_create_engine(sa_url, **kwargs)
        if idle_ping is not None:
            install_idle_ping(engine, idle_ping)
        return engine

    mode, in_memory, connect_args = _prepare_sqlite(
        sa_url, sqlite_begin, sqlite_busy_timeout_ms, kwargs
    )
    if not in_memory:
        # SQLite connections are cheap, and listeners, check-backs and consumers all hold one
        # briefly: a larger pool avoids threads queueing for a connection behind the write lock.
        kwargs.setdefault("pool_size", 20)
        kwargs.setdefault("max_overflow", 40)
    _pool_options(kwargs)
    engine = _sa_create_engine(sa_url, connect_args=connect_args, **kwargs)
    _install_sqlite_hooks(engine, mode, sqlite_busy_timeout_ms, sqlite_synchronous, in_memory)
    return engine


def _prepare_sqlite(
    sa_url: URL, sqlite_begin: str, busy_timeout_ms: int, kwargs: dict[str, Any]
) -> tuple[str, bool, dict[str, Any]]:
    """What a SQLite engine needs before it is made, sync or async alike (both must refuse the
    same ``sqlite_begin`` and wait on a busy database as long): the BEGIN mode, whether the
    database is in memory (else its folder is created), and the driver's ``connect_args``
    (taken out of ``kwargs``)."""
    mode = sqlite_begin.upper()
    if mode not in _BEGIN_MODES:
        raise ConfigError(f"sqlite_begin must be one of {_BEGIN_MODES}, not {sqlite_begin!r}")
    in_memory = is_in_memory_sqlite(sa_url)
    if not in_memory:
        Path(sa_url.database or "").expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    connect_args: dict[str, Any] = dict(kwargs.pop("connect_args", {}))
    connect_args.setdefault("check_same_thread", False)
    connect_args.setdefault("timeout", busy_timeout_ms / 1000.0)
    return mode, in_memory, connect_args


def is_in_memory_sqlite(url: str | URL | Engine) -> bool:
    """Whether ``url`` (or an engine's URL) names an in-memory SQLite database.

    Such a database lives in one connection: threads that share it share that connection's single
    transaction, so code that runs its own thread next to the caller's (the orderly journal's
    sweeper) refuses it."""
    sa_url = url.url if isinstance(url, Engine) else make_url(url)
    if sa_url.get_backend_name() != "sqlite":
        return False
    database = sa_url.database or ""
    return (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or sa_url.query.get("mode") == "memory"
    )


def _install_sqlite_hooks(
    engine: Engine, mode: str, busy_timeout_ms: int, synchronous: str, in_memory: bool
) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Stop pysqlite from issuing its own (deferred) BEGIN; _on_begin below emits ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if not in_memory:
                cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        options = conn.get_execution_options()
        if options.get("isolation_level") == "AUTOCOMMIT":
            return
        chosen = str(options.get(SQLITE_BEGIN_OPTION, mode)).upper()
        if chosen not in _BEGIN_MODES:
            chosen = mode
        _driver_execute(conn, f"BEGIN {chosen}")

    @event.listens_for(engine, "reset")
    def _on_reset(dbapi_connection: Any, record: Any, state: PoolResetState) -> None:
        # Rollback-on-return only when a transaction is open (the pool's own reset is off, see
        # _pool_options): after a commit there is none, and on aiosqlite each rollback is a
        # round trip through the connection's thread for nothing.
        if state.terminate_only or not state.asyncio_safe:
            return  # the pool discards the connection (or cannot await here): nothing to reset
        if getattr(record.driver_connection, "in_transaction", True):
            dbapi_connection.rollback()


def server_pool_options(kwargs: dict[str, Any], pre_ping_after_idle: float | None) -> float | None:
    """Choose a server database's stale-connection check: returns the idle seconds after which
    :func:`~txmsg.sqla.ping.install_idle_ping` should ping, or None when ``kwargs`` now ask
    SQLAlchemy to ping at every checkout (``pre_ping_after_idle=None`` or the caller's own
    ``pool_pre_ping``).

    Raises:
        ConfigError: ``pre_ping_after_idle`` is not a number >= 0.
    """
    if pre_ping_after_idle is not None and (
        isinstance(pre_ping_after_idle, bool)
        or not isinstance(pre_ping_after_idle, int | float)
        or pre_ping_after_idle < 0
    ):
        raise ConfigError(
            f"pre_ping_after_idle must be seconds >= 0 (or None to ping at every checkout), not "
            f"{pre_ping_after_idle!r}"
        )
    if "pool_pre_ping" in kwargs or pre_ping_after_idle is None:
        kwargs.setdefault("pool_pre_ping", True)
        return None
    return float(pre_ping_after_idle)


def _pool_options(kwargs: dict[str, Any]) -> None:
    """The pool's rollback-on-return is done by the ``reset`` hook of
    :func:`_install_sqlite_hooks` instead, which skips it when no transaction is open (SQLite's
    ``in_transaction`` is exact and costs no I/O); a caller's own choice wins."""
    kwargs.setdefault("pool_reset_on_return", None)


def _driver_execute(conn: Connection, sql: str) -> None:
    """Run ``sql`` (``BEGIN ...``) on the driver connection itself: one call, where
    ``exec_driver_sql`` costs a cursor, an execute and a close, each a round trip through
    aiosqlite's thread on an async engine, plus SQLAlchemy's execution machinery (a third of an
    ORM insert's CPU on the event loop, measured with benchmarks.async_send).  Errors are raised
    as SQLAlchemy raises them (``OperationalError`` for "database is locked")."""
    proxied = conn.connection
    dbapi_connection = proxied.dbapi_connection
    try:
        if isinstance(dbapi_connection, AdaptedConnection):
            dbapi_connection.run_async(lambda driver: driver.execute(sql))
        else:
            proxied.driver_connection.execute(sql)  # type: ignore[union-attr]
    except conn.dialect.loaded_dbapi.Error as error:
        raise DBAPIError.instance(
            sql, None, error, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect
        ) from error


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A ``sessionmaker`` whose objects stay readable after commit (``expire_on_commit=False``),
    which is what handlers that return data from a finished transaction expect."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def bound_engine(session_factory: object) -> Engine | None:
    """The engine a ``sessionmaker(bind=engine)`` makes its sessions on (it keeps the bind in
    ``.kw``), or None for any other session factory (a function, a ``scoped_session``, a
    sessionmaker bound to a connection): the Core fast paths, and the checks that need the
    engine itself, fall back to sessions then."""
    bind = getattr(session_factory, "kw", {}).get("bind")
    return bind if isinstance(bind, Engine) else None


def read_only(session: Session) -> None:
    """Ask for a non-locking transaction on SQLite (``BEGIN DEFERRED``); no-op elsewhere.

    Call it first thing in a fresh session, before any query.
    """
    session.connection(execution_options={SQLITE_BEGIN_OPTION: "DEFERRED"})
