"""Async engines tuned like :func:`txmsg.sqla.create_engine`, and telling session factories apart.

The SQLite settings that make check-backs and dedup rows behave (WAL, busy timeout, ``BEGIN
IMMEDIATE``; see :mod:`txmsg.sqla.engine`) are connection hooks, so the async engine gets the very
same hooks on its sync core (``engine.sync_engine``).  ``sqlite://`` URLs use aiosqlite,
``postgresql://`` ones psycopg 3 in its async mode; ``postgresql+asyncpg://`` asyncpg
(``txmsg[asyncpg]``), which spends less CPU on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL, make_url

from txmsg.errors import ConfigError
from txmsg.sqla.engine import (
    _install_sqlite_hooks,
    _pool_options,
    _prepare_sqlite,
    server_pool_options,
)
from txmsg.sqla.ping import PING_AFTER_IDLE, install_idle_ping

try:  # the async extra: sqlalchemy.ext.asyncio needs greenlet at run time
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
    from sqlalchemy.ext.asyncio import create_async_engine as _sa_create_async_engine
except ImportError:  # pragma: no cover - SQLAlchemy 2 always has the module
    async_sessionmaker = None  # type: ignore[assignment,misc]

ASYNC_SQLITE_POOL = 8
"""Connections an async SQLite file engine keeps (and may add again as overflow) by default."""

AsyncSessionFactory = Callable[[], "AsyncSession"]
"""Anything that returns a new ``AsyncSession`` (an ``async_sessionmaker`` is one)."""

_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+psycopg"}


def async_url(url: str | URL) -> URL:
    """``url`` with the async driver txmsg installs (aiosqlite, psycopg) when it names none."""
    sa_url = make_url(url)
    backend = sa_url.get_backend_name()
    if sa_url.drivername == backend and backend in _ASYNC_DRIVERS:
        sa_url = sa_url.set(drivername=_ASYNC_DRIVERS[backend])
    return sa_url


def create_async_engine(
    url: str | URL,
    *,
    sqlite_busy_timeout_ms: int = 30_000,
    sqlite_begin: str = "IMMEDIATE",
    sqlite_synchronous: str = "NORMAL",
    pre_ping_after_idle: float | None = PING_AFTER_IDLE,
    **kwargs: Any,
) -> AsyncEngine:
    """An ``AsyncEngine`` configured as :func:`txmsg.sqla.create_engine` configures a sync one
    (``pre_ping_after_idle`` as there).

    Raises:
        ConfigError: an unknown ``sqlite_begin`` mode, a negative ``pre_ping_after_idle``, or
            the async driver is not installed (``pip install 'txmsg[async]'``).
    """
    sa_url = async_url(url)
    try:
        if sa_url.get_backend_name() != "sqlite":
            idle_ping = server_pool_options(kwargs, pre_ping_after_idle)
            engine = _sa_create_async_engine(sa_url, **kwargs)
            if idle_ping is not None:
                install_idle_ping(engine.sync_engine, idle_ping)
            return engine
        mode, in_memory, connect_args = _prepare_sqlite(
            sa_url, sqlite_begin, sqlite_busy_timeout_ms, kwargs
        )
        if not in_memory:
            # Fewer than the sync engine's 20 + 40: SQLite writes one transaction at a time, and
            # each aiosqlite connection is a thread of its own, so past a handful more
            # connections only add threads polling for the write lock, while waiting for a
            # pooled connection costs the loop nothing (benchmarks.async_send --pool 60 vs 8:
            # docs/guide/async.md#measured).
            kwargs.setdefault("pool_size", ASYNC_SQLITE_POOL)
            kwargs.setdefault("max_overflow", ASYNC_SQLITE_POOL)
        _pool_options(kwargs)
        engine = _sa_create_async_engine(sa_url, connect_args=connect_args, **kwargs)
    except ImportError as exc:
        raise ConfigError(
            f"the async driver of {sa_url.drivername} is not installed ({exc}); "
            "pip install 'txmsg[async]' (aiosqlite; PostgreSQL uses psycopg: 'txmsg[postgres]', "
            "or asyncpg for postgresql+asyncpg:// URLs: 'txmsg[asyncpg]')"
        ) from exc
    _install_sqlite_hooks(
        engine.sync_engine, mode, sqlite_busy_timeout_ms, sqlite_synchronous, in_memory
    )
    return engine


def make_async_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """An ``async_sessionmaker`` whose objects stay readable after commit (as
    :func:`txmsg.sqla.make_session_factory`): awaiting a lazy load after commit is an error in
    async SQLAlchemy, so ``expire_on_commit=False`` matters even more here."""
    return async_sessionmaker(engine, expire_on_commit=False)


def is_async_session_factory(factory: object) -> bool:
    """True when ``factory`` makes ``AsyncSession`` objects (an ``async_sessionmaker``, or a
    callable marked ``txmsg_async = True``)."""
    if async_sessionmaker is not None and isinstance(factory, async_sessionmaker):
        return True
    return getattr(factory, "txmsg_async", False) is True
