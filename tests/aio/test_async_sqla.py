"""Issue 27: ``async def`` idempotent listeners on async SQLAlchemy (aiosqlite), both backends.

The effects and the dedup row commit in one ``AsyncSession`` transaction: a message delivered
twice (two copies with one ``UNIQ_KEY``) is applied once; a failing one rolls back and is
redelivered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Integer, String, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from txmsg_broker.testing import create_topic, unique

from txmsg import ListenerDefinitionError, Message, TxMsg
from txmsg.aio.sqla import (
    AsyncIdempotentConsumer,
    create_async_engine,
    make_async_session_factory,
)
from txmsg.message import DEDUP_KEY
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.models import metadata


class Base(DeclarativeBase):
    pass


class Points(Base):
    __tablename__ = "aio_points"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order: Mapped[str] = mapped_column(String(64))


def test_async_idempotent_listener_applies_each_message_once(
    make_app: Callable[..., TxMsg], broker: Any, database_url: str
) -> None:
    """Two copies of one message (same dedup key) and a first failing delivery: the effects are
    written once per message, the duplicate is absorbed, the failure is redelivered."""
    topic = unique("aio_idem")
    create_topic(broker.namesrv_addr, topic, message_type="NORMAL")
    engine = create_async_engine(database_url)
    sessions = make_async_session_factory(engine)
    a, boom, dedup = unique("a"), unique("boom"), unique("dup-key")  # apart on a shared database
    failures = {boom: 1}

    app, group = make_app(), unique("pg_idem")
    app.add_producer(group=group)

    @app.message_listener(
        topic=topic, group=unique("cg_idem"), idempotent=True, session_factory=sessions
    )
    async def add_points(message: Message, session: AsyncSession) -> None:
        session.add(Points(order=message.text()))
        await session.flush()
        if failures.get(message.text(), 0) > 0:
            failures[message.text()] -= 1
            raise RuntimeError("the first delivery of boom fails")

    consumer = app.registry.consumers[next(iter(app.registry.consumers))].handler
    assert isinstance(consumer, AsyncIdempotentConsumer)

    async def count() -> dict[str, int]:
        async with sessions() as session:
            rows = await session.execute(
                select(Points.order, func.count())
                .where(Points.order.in_([a, boom]))
                .group_by(Points.order)
            )
            return {order: n for order, n in rows.all()}

    async def main() -> dict[str, int]:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
            await conn.run_sync(metadata.create_all)
        async with app:
            producer = app.async_producer(group)
            await producer.send(topic, a, properties={DEDUP_KEY: dedup})
            await producer.send(topic, a, properties={DEDUP_KEY: dedup})  # the copy
            await producer.send(topic, boom)
            while consumer.applied < 2 or consumer.duplicates < 1:
                await asyncio.sleep(0.05)
            counted = await count()
        await engine.dispose()
        return counted

    counted = asyncio.run(asyncio.wait_for(main(), 240))
    assert counted == {a: 1, boom: 1}
    assert (consumer.applied, consumer.duplicates) == (2, 1)


def test_session_factory_must_match_the_listener(
    make_app: Callable[..., TxMsg], tmp_path: Path
) -> None:
    """An async listener with a sync sessionmaker (and the reverse) is refused at declaration,
    naming the factory to pass."""
    app = make_app()
    engine = create_engine(f"sqlite:///{tmp_path / 'sync.db'}")
    create_tables(engine)
    sync_sessions = make_session_factory(engine)
    async_sessions = make_async_session_factory(
        create_async_engine(f"sqlite:///{tmp_path / 'async.db'}")
    )

    async def fn(message: Message, session: Any) -> None: ...

    def plain(message: Message, session: Any) -> None: ...

    with pytest.raises(ListenerDefinitionError, match="async_sessionmaker"):
        app.add_message_listener(
            fn, topic="t", group="g1", idempotent=True, session_factory=sync_sessions
        )
    with pytest.raises(ListenerDefinitionError, match=r"sessionmaker\(engine\)"):
        app.add_message_listener(
            plain, topic="t", group="g2", idempotent=True, session_factory=async_sessions
        )
    engine.dispose()


def test_orderly_listener_refuses_async_sessions_naming_the_fix(
    make_app: Callable[..., TxMsg], tmp_path: Path
) -> None:
    """An orderly listener keeps its parked keys and journal in sync sessions, and an orderly
    idempotent one commits its effects with the dedup row there too: an async session factory,
    or an ``async def`` idempotent handler, is refused at declaration with one fix (not the
    idempotent rule's "pass an async_sessionmaker", which the orderly rule would then refuse).
    A plain orderly idempotent listener on a sync factory, and an ``async def`` orderly one
    without idempotent=True, are accepted."""
    app = make_app()
    engine = create_engine(f"sqlite:///{tmp_path / 'sync.db'}")
    create_tables(engine)
    sync_sessions = make_session_factory(engine)
    async_engine = create_async_engine(f"sqlite:///{tmp_path / 'async.db'}")
    async_sessions = make_async_session_factory(async_engine)

    async def settle(message: Message, session: Any) -> None: ...

    def plain(message: Message, session: Any) -> None: ...

    async def fn(message: Message) -> None: ...

    fix = r"plain `def \(message, session\)` with session_factory=sessionmaker\(engine\)"
    for handler, factory, given in [
        (settle, async_sessions, "an async session factory"),
        (plain, async_sessions, "an async session factory"),
        (settle, sync_sessions, "an `async def` handler"),
    ]:
        with pytest.raises(ListenerDefinitionError, match=fix) as refused:
            app.add_message_listener(
                handler,
                topic="t",
                group=unique("cg_ord"),
                orderly=True,
                idempotent=True,
                session_factory=factory,
            )
        assert f"orderly=True with idempotent=True cannot take {given}" in str(refused.value)
        assert "drop idempotent=True" in str(refused.value)
    with pytest.raises(ListenerDefinitionError, match=r"pass session_factory=sessionmaker\(engine"):
        app.add_message_listener(
            fn, topic="t", group=unique("cg_ord"), orderly=True, session_factory=async_sessions
        )
    app.add_message_listener(
        plain,
        topic="t",
        group="cg_ord_ok",
        orderly=True,
        idempotent=True,
        session_factory=sync_sessions,
    )
    app.add_message_listener(
        fn, topic="t", group="cg_ord_async", orderly=True, session_factory=sync_sessions
    )
    assert {"cg_ord_ok", "cg_ord_async"} <= {c.group for c in app.registry.consumers.values()}
    engine.dispose()  # the async engine never connected: nothing to close
