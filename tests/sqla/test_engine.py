"""Engine helper: the settings the record and dedup logic rely on."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from txmsg import ConfigError
from txmsg.sqla import create_engine, make_session_factory, read_only


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
