"""Engine helper: the settings the record and dedup logic rely on."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from txmsg import ConfigError
from txmsg.sqla import create_engine, make_session_factory, read_only

from .conftest import PG_URL


def test_postgres_urls_get_the_psycopg3_driver() -> None:
    engine = create_engine("postgresql://u@127.0.0.1:1/db")
    assert engine.url.drivername == "postgresql+psycopg"
    engine.dispose()


def test_bad_begin_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sqlite_begin"):
        create_engine(f"sqlite:///{tmp_path / 'x.db'}", sqlite_begin="LAZY")


def test_sqlite_folder_is_created_and_writers_wait_instead_of_failing(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'deep' / 'dir' / 'x.db'}")
    sessions = make_session_factory(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (n INTEGER)"))
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            for _ in range(20):
                with sessions() as s, s.begin():
                    # read then write: with a deferred BEGIN this upgrade can fail with
                    # SQLITE_BUSY(_SNAPSHOT) at once; BEGIN IMMEDIATE makes it wait instead
                    n = s.execute(text("SELECT count(*) FROM t")).scalar_one()
                    s.execute(text("INSERT INTO t (n) VALUES (:n)"), {"n": n + i})
        except BaseException as exc:  # noqa: BLE001 - any failure in the thread is reported below  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with sessions() as s:
        read_only(s)
        assert s.execute(text("SELECT count(*) FROM t")).scalar_one() == 80
    engine.dispose()


def test_sqlite_begin_is_immediate_and_errors_stay_sqlalchemy_errors(tmp_path: Path) -> None:
    """BEGIN goes to the driver directly (one call, not a cursor + execute + close); a locked
    database still raises SQLAlchemy's OperationalError naming the statement."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    holder = create_engine(url)
    waiter = create_engine(url, sqlite_busy_timeout_ms=50)
    with holder.connect() as conn, conn.begin():
        # IMMEDIATE took the write lock before any statement: a second writer cannot begin
        assert conn.connection.driver_connection.in_transaction  # type: ignore[union-attr]
        with pytest.raises(OperationalError, match="BEGIN IMMEDIATE") as raised, waiter.begin():
            pass  # pragma: no cover - the BEGIN fails
        assert "locked" in str(raised.value.orig)
    with waiter.begin() as conn:  # released: it begins now
        assert conn.connection.driver_connection.in_transaction  # type: ignore[union-attr]
    holder.dispose()
    waiter.dispose()


def test_sqlite_connection_returned_in_a_transaction_is_rolled_back(tmp_path: Path) -> None:
    """The pool's rollback-on-return runs only when a transaction is open (after a commit
    there is none), and then it does run: nothing of an abandoned transaction survives."""
    engine = create_engine(f"sqlite:///{tmp_path / 'x.db'}", pool_size=1, max_overflow=0)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (n INTEGER)"))
    raw = engine.raw_connection()
    driver = raw.driver_connection
    driver.execute("BEGIN IMMEDIATE")  # type: ignore[union-attr]
    driver.execute("INSERT INTO t (n) VALUES (1)")  # type: ignore[union-attr]
    raw.close()  # back to the pool with the transaction open
    assert not driver.in_transaction  # type: ignore[union-attr]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 0
    engine.dispose()


def test_bad_pre_ping_after_idle_is_refused() -> None:
    with pytest.raises(ConfigError, match="pre_ping_after_idle"):
        create_engine("postgresql://u@127.0.0.1:1/db", pre_ping_after_idle=-1)


def _killed_after_idle(after: float) -> tuple[int, int, list[bool]]:
    """Use a pooled PostgreSQL connection twice, kill it on the server, wait 0.3 s, use the pool
    again: (first backend pid, last backend pid, the pings done)."""
    engine = create_engine(PG_URL, pool_size=1, max_overflow=0, pre_ping_after_idle=after)
    pings: list[bool] = []
    ping = engine.dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        pings.append(ping(dbapi_connection))
        return pings[-1]

    engine.dialect.do_ping = counted  # type: ignore[method-assign]
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as conn:  # used moments ago: not pinged
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() == pid
        assert pings == []
        killer = create_engine(PG_URL)
        with killer.begin() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
        killer.dispose()
        time.sleep(0.3)
        with engine.connect() as conn:
            return pid, conn.execute(text("SELECT pg_backend_pid()")).scalar_one(), pings
    finally:
        engine.dispose()


@pytest.mark.skipif(not PG_URL, reason="needs TXMSG_TEST_PG_URL (scripts/pg.sh)")
def test_idle_connection_killed_by_the_server_is_replaced_at_checkout() -> None:
    """A pooled connection idle past ``pre_ping_after_idle`` is pinged (one in use moments ago
    is not); one the server killed is replaced before use instead of failing the caller."""
    first, last, pings = _killed_after_idle(0.2)
    assert first != last
    assert pings == []  # the ping raised (a disconnect): the pool connected afresh
    with pytest.raises(OperationalError):  # the same without the idle ping: the caller fails
        _killed_after_idle(60)
