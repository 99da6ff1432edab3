"""Database fixtures: every test runs on SQLite, and on PostgreSQL too when TXMSG_TEST_PG_URL is set
(``export TXMSG_TEST_PG_URL=$(scripts/pg.sh)``).  Each PostgreSQL test gets its own schema, so
tests never see each other's rows and nothing needs cleaning by hand."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from txmsg.sqla import create_engine, create_tables, make_session_factory

from .business import BusinessBase

PG_URL = os.environ.get("TXMSG_TEST_PG_URL", "").strip()
BACKENDS = ["sqlite"] + (["postgresql"] if PG_URL else [])


@dataclass
class Db:
    name: str
    engine: Engine
    sessions: sessionmaker[Session]


def _pg_engine(schema: str) -> Engine:
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    return create_engine(
        PG_URL, connect_args={"options": f"-csearch_path={schema}"}, pool_size=10, max_overflow=20
    )


def _drop_pg_schema(schema: str) -> None:
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    admin.dispose()


def make_db(
    backend: str, tmp_path: Path, *, sqlite_busy_timeout_ms: int | None = None
) -> Iterator[Db]:
    """An empty database with the txmsg tables and the test business tables (SQLite: with the
    given busy timeout, else txmsg's default)."""
    if backend == "sqlite":
        engine = create_engine(
            f"sqlite:///{tmp_path / 'test.db'}",
            sqlite_busy_timeout_ms=sqlite_busy_timeout_ms or 30_000,  # txmsg's default
        )
        schema = None
    else:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        engine = _pg_engine(schema)
    try:
        create_tables(engine)
        BusinessBase.metadata.create_all(engine)
        yield Db(backend, engine, make_session_factory(engine))
    finally:
        engine.dispose()
        if schema is not None:
            _drop_pg_schema(schema)


@pytest.fixture(params=BACKENDS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    yield from make_db(request.param, tmp_path)
