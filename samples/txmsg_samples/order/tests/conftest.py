"""Fixtures for the order sample's business tests: four databases, one per service.

SQLite always; PostgreSQL too when ``TXMSG_TEST_PG_URL`` is set (``scripts/pg.sh`` prints one),
each service in its own schema, dropped afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker
from txmsg_broker.testing import wait_until

from txmsg.message import UNIQ_KEY, Message
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.states import LocalTransactionState as S
from txmsg_samples.order import cart, logistics, points
from txmsg_samples.order.orders import OrderBase, PaymentListener


@dataclass
class Dbs:
    orders: sessionmaker[Session]
    points: sessionmaker[Session]
    logistics: sessionmaker[Session]
    cart: sessionmaker[Session]


PG_URL = os.environ.get("TXMSG_TEST_PG_URL", "").strip()


def _pg_admin(sql: str) -> None:
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(sql))
    admin.dispose()


@pytest.fixture(params=["sqlite"] + (["postgresql"] if PG_URL else []))
def dbs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Dbs]:
    engines: list[Engine] = []
    schemas: list[str] = []

    def make(name: str, base: type) -> sessionmaker[Session]:
        if request.param == "sqlite":
            engine = create_engine(f"sqlite:///{tmp_path / name}.db")
        else:
            schema = f"s_{name}_{uuid.uuid4().hex[:10]}"
            _pg_admin(f'CREATE SCHEMA "{schema}"')
            schemas.append(schema)
            engine = create_engine(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
        engines.append(engine)
        base.metadata.create_all(engine)  # type: ignore[attr-defined]
        create_tables(engine)
        return make_session_factory(engine)

    yield Dbs(
        orders=make("orders", OrderBase),
        points=make("points", points.PointsBase),
        logistics=make("logistics", logistics.LogisticsBase),
        cart=make("cart", cart.CartBase),
    )
    for engine in engines:
        engine.dispose()
    for schema in schemas:
        _pg_admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class InlinePublisher:
    """Test stand-in for a TransactionalProducer: runs the listener's local transaction right
    away, the way the real producer does after the half send, and keeps committed messages."""

    def __init__(self, listener: PaymentListener) -> None:
        self.listener = listener
        self.committed: list[Message] = []
        self.states: list[S] = []

    def send_in_transaction(
        self,
        topic: str,
        payload: Any,
        *,
        arg: Any = None,
        keys: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> S:
        msg = Message(
            topic=topic,
            body=payload,
            tags=tags,
            keys=keys,
            properties={**(properties or {}), UNIQ_KEY: uuid.uuid4().hex},
            message_id=None,
        )
        state = self.listener.execute_local(msg, arg)
        if (
            state is S.UNKNOW
        ):  # what the broker's check-back loop does: ask until the answer is definite

            def definite() -> S | None:
                answer = self.listener.check_local(msg)
                return None if answer is S.UNKNOW else answer

            state = (
                wait_until(definite, timeout=30, message="a definite check-back answer") or state
            )
        self.states.append(state)
        if state is S.COMMIT:
            self.committed.append(msg)
        return state
