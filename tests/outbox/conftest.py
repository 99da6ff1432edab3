"""Fixtures of the outbox tests: a database per test on SQLite, and on PostgreSQL too when
``TXMSG_TEST_PG_URL`` is set (``export TXMSG_TEST_PG_URL=$(scripts/pg.sh)``), each PostgreSQL test
in its own schema; the txmsg tables (outbox included) and the tests' business table created.

Not a package (like tests/rocketmq): modules import helpers by basename, so ``tests/outbox`` and
``tests/`` go on ``sys.path`` (``crash_kit``-style helpers live in ``outbox_kit.py``).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, make_url, text
from sqlalchemy.orm import Session, sessionmaker

from txmsg.sqla import create_engine, create_tables, make_session_factory

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

from outbox_kit import Base, Side  # noqa: E402 - needs the path above

PG_URL = os.environ.get("TXMSG_TEST_PG_URL", "").strip()
DATABASES = ["sqlite"] + (["postgresql"] if PG_URL else [])


@dataclass
class Db:
    name: str
    url: str
    """What a child process connects to (PostgreSQL: with the schema in ``options``)."""
    engine: Engine
    sessions: sessionmaker[Session]
    schema: str | None = None

    def url_for_cli(self) -> str:
        """The URL with the schema in it (for ``--database``)."""
        if self.schema is None:
            return self.url
        return str(
            make_url(self.url).update_query_dict({"options": f"-csearch_path={self.schema}"})
        )


def _admin(sql: str) -> None:
    admin = create_engine(PG_URL)
    try:
        with admin.begin() as conn:
            conn.execute(text(sql))
    finally:
        admin.dispose()


def make_db(kind: str, tmp_path: Path) -> Iterator[Db]:
    """An empty database with the txmsg tables and the tests' business table."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'outbox.db'}"
        engine = create_engine(url)
        schema = None
    else:
        schema = f"o_{uuid.uuid4().hex[:12]}"
        _admin(f'CREATE SCHEMA "{schema}"')
        url = PG_URL
        engine = create_engine(
            PG_URL,
            connect_args={"options": f"-csearch_path={schema}"},
            pool_size=10,
            max_overflow=20,
        )
    try:
        create_tables(engine)
        Base.metadata.create_all(engine)
        yield Db(kind, url, engine, make_session_factory(engine), schema)
    finally:
        engine.dispose()
        if schema is not None:
            _admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=DATABASES)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    yield from make_db(request.param, tmp_path)


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[Db]:
    """PostgreSQL only (skipped without ``TXMSG_TEST_PG_URL``)."""
    if not PG_URL:
        pytest.skip("needs PostgreSQL: export TXMSG_TEST_PG_URL=$(scripts/pg.sh)")
    yield from make_db("postgresql", tmp_path)


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[Db]:
    yield from make_db("sqlite", tmp_path)


@pytest.fixture(params=["rocketmq", "rocketmq5"])
def side(request: pytest.FixtureRequest, tmp_path: Path) -> Side:
    """Each backend on its embedded broker (``txmsg_broker`` / ``txmsg_grpc_broker``)."""
    broker = request.getfixturevalue(
        "txmsg_grpc_broker" if request.param == "rocketmq5" else "txmsg_broker"
    )
    return Side(request.param, broker, tmp_path)
