"""Issue 27: ``AsyncRecordBackedListener`` on async SQLAlchemy (aiosqlite; PostgreSQL through
psycopg's async mode when ``TXMSG_TEST_PG_URL`` is set), both backends.

The record written in the business change's own database transaction answers check-backs: a
commit whose answer is lost (UNKNOW) is checked back COMMIT from its record; a failing change
rolls back with its record and never reaches consumers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlalchemy import String, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from txmsg_broker.testing import unique

from txmsg import LocalTransactionState, Message, TxMsg
from txmsg.aio.sqla import (
    AsyncRecordBackedListener,
    create_async_engine,
    make_async_session_factory,
)
from txmsg.sqla.models import RecordState, TransactionRecord, metadata

S = LocalTransactionState


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "aio_order"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))


class PayOrder(AsyncRecordBackedListener):
    """Pays the order named by ``arg``; the order "boom" fails; an order ending in "-lost"
    commits but answers UNKNOW, as if the answer were lost on the way to the broker."""

    async def execute_in_transaction(
        self, session: AsyncSession, message: Message, arg: Any
    ) -> None:
        if arg == "boom":
            raise RuntimeError("the payment gateway refused")
        session.add(Order(id=f"{arg}-{message.transaction_key}", status="PAID"))

    async def execute_local(self, message: Message, arg: Any) -> S:
        state = await super().execute_local(message, arg)
        return S.UNKNOW if str(arg).endswith("-lost") and state is S.COMMIT else state


def test_async_record_backed_listener_answers_from_its_records(
    make_app: Callable[..., TxMsg], topic: str, database_url: str
) -> None:
    engine = create_async_engine(database_url)
    sessions = make_async_session_factory(engine)
    got: list[str] = []

    async def consume(message: Message) -> None:
        got.append(message.text())

    app, group = make_app(), unique("pg_rec")
    app.add_transactional_listener(PayOrder(sessions), group=group, topics=[topic])
    app.add_message_listener(consume, topic=topic, group=unique("cg_rec"))

    async def main() -> tuple[list[Any], dict[str, str], list[str]]:
        try:
            return await scenario()
        finally:  # also when the wait times out: leaked connections fail a later test instead
            await engine.dispose()

    async def scenario() -> tuple[list[Any], dict[str, str], list[str]]:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
            await conn.run_sync(metadata.create_all)
        async with app:
            producer = app.async_transactional_producer(group)
            results = [
                await producer.send_in_transaction(topic, "paid", arg="o1"),
                await producer.send_in_transaction(topic, "boom", arg="boom"),
                await producer.send_in_transaction(topic, "lost", arg="o2-lost"),
            ]
            # at least once each: a check-back that reaches a transaction already committed
            # (its op record still in the broker's batch, or its end still on the way - slow
            # async PostgreSQL under load) is answered COMMIT from the record and delivered
            # again, as RocketMQ does; waiting for exactly one copy each never ended then
            while not {"lost", "paid"} <= set(got):
                await asyncio.sleep(0.05)
        keys = [r.transaction_key for r in results]
        async with sessions() as session:
            records = {
                row.transaction_key: row.state
                for row in (
                    await session.scalars(
                        select(TransactionRecord).where(TransactionRecord.transaction_key.in_(keys))
                    )
                ).all()
            }
            orders = sorted(
                (await session.scalars(select(Order.id).where(Order.id.like("%-%")))).all()
            )
            orders = [o for o in orders if o.split("-")[-1] in keys]
        return results, records, orders

    results, records, orders = asyncio.run(asyncio.wait_for(main(), 240))
    paid, boom, lost = results
    assert [r.local_state for r in results] == [S.COMMIT, S.ROLLBACK, S.UNKNOW]
    assert records == {
        paid.transaction_key: RecordState.COMMITTED.value,
        boom.transaction_key: RecordState.ROLLED_BACK.value,
        lost.transaction_key: RecordState.COMMITTED.value,
    }
    assert orders == sorted([f"o1-{paid.transaction_key}", f"o2-lost-{lost.transaction_key}"])
    assert set(got) == {"lost", "paid"}  # "lost" was committed by its check-back, "boom" never
    assert app.stats()[group].checks.checks >= 1
