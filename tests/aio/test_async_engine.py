"""Issue 27: what ``create_async_engine`` configures, on the event loop: SQLite's ``BEGIN
IMMEDIATE`` straight to aiosqlite (one hop through its thread), rollback-on-return only for an
open transaction, and on PostgreSQL (psycopg's async mode, asyncpg) the idle-only pre-ping that
replaces a connection the server killed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError

from txmsg.aio.sqla import create_async_engine
from txmsg.aio.sqla.engine import ASYNC_SQLITE_POOL
from txmsg.sqla import create_engine

PG_URL = os.environ.get("TXMSG_TEST_PG_URL", "").strip()


def test_sqlite_begin_immediate_and_reset_on_the_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"

    async def main() -> None:
        holder = create_async_engine(url, pool_size=1, max_overflow=0)
        waiter = create_async_engine(url, sqlite_busy_timeout_ms=50)
        async with holder.begin() as conn:
            await conn.execute(text("CREATE TABLE t (n INTEGER)"))
        async with holder.connect() as conn:
            await conn.begin()
            raw = await conn.get_raw_connection()
            assert raw.driver_connection.in_transaction  # type: ignore[union-attr]
            with pytest.raises(OperationalError, match="BEGIN IMMEDIATE"):
                async with waiter.begin():
                    pass  # pragma: no cover - the BEGIN fails: the write lock is taken
            await conn.commit()
        async with holder.connect() as conn:  # returned with a transaction open: rolled back
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            await driver.execute("BEGIN IMMEDIATE")
            await driver.execute("INSERT INTO t (n) VALUES (1)")
        assert not driver.in_transaction
        async with waiter.begin() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar_one() == 0
        await holder.dispose()
        await waiter.dispose()

    asyncio.run(main())


@pytest.mark.skipif(not PG_URL, reason="needs TXMSG_TEST_PG_URL (scripts/pg.sh)")
@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_idle_connection_killed_by_the_server_is_replaced(driver: str) -> None:
    url = make_url(PG_URL).set(drivername=f"postgresql+{driver}")

    async def pid_after_kill(after: float) -> tuple[int, int]:
        engine = create_async_engine(url, pool_size=1, max_overflow=0, pre_ping_after_idle=after)
        try:
            async with engine.connect() as conn:
                pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            killer = create_engine(PG_URL)
            with killer.begin() as sync_conn:
                sync_conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            killer.dispose()
            await asyncio.sleep(0.3)
            async with engine.connect() as conn:
                return pid, (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        finally:
            await engine.dispose()

    first, last = asyncio.run(pid_after_kill(0.2))
    assert first != last
    with pytest.raises(DBAPIError):
        asyncio.run(pid_after_kill(60))  # without the idle ping the caller's statement fails


def test_async_sqlite_pool_is_small_by_default_and_yours_wins(tmp_path: Path) -> None:
    """Each aiosqlite connection is a thread: the async SQLite engine keeps 8 (not the sync
    engine's 20), unless told otherwise."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    default, chosen = create_async_engine(url), create_async_engine(url, pool_size=3)
    assert default.sync_engine.pool.size() == ASYNC_SQLITE_POOL == 8  # type: ignore[attr-defined]
    assert chosen.sync_engine.pool.size() == 3  # type: ignore[attr-defined]
    assert create_engine(url).pool.size() == 20  # type: ignore[attr-defined]
