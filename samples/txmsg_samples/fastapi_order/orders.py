"""The order service: a FastAPI app whose ``/pay`` pays an order with a transactional message.

The listener is record-backed on async SQLAlchemy: marking the order PAID and the transaction
record commit together, so a check-back answers from the record.  The HTTP handler awaits the
send (the broker round trip runs off the loop); the server keeps serving meanwhile.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from txmsg import AsyncTransactionalProducer, LocalTransactionState, Message, TxMsg, TxMsgConfig
from txmsg.aio.sqla import AsyncRecordBackedListener
from txmsg.fastapi import async_transactional_producer, lifespan
from txmsg_samples.fastapi_order.models import Order

GROUP = "fastapi-order-tx"
TOPIC = "fastapi-order-paid"

OrderProducer = Annotated[AsyncTransactionalProducer, Depends(async_transactional_producer(GROUP))]
"""What a handler declares to get the awaitable producer of the order group."""


class NewOrder(BaseModel):
    item: str
    amount_cents: int


class OrderView(BaseModel):
    id: str
    item: str
    amount_cents: int
    status: str
    transaction_key: str | None = None


class PayOrder(AsyncRecordBackedListener):
    """The local transaction: the order becomes PAID in the same transaction as its record."""

    async def execute_in_transaction(
        self, session: AsyncSession, message: Message, arg: Any
    ) -> object:
        order = await session.get(Order, arg, with_for_update=True)
        if order is None or order.status != "NEW":
            return LocalTransactionState.ROLLBACK  # paid meanwhile, or gone: no message
        order.status = "PAID"
        return None


def build(config: TxMsgConfig, sessions: async_sessionmaker[AsyncSession]) -> tuple[FastAPI, TxMsg]:
    """The FastAPI app and its TxMsg app (started and closed by the FastAPI lifespan)."""
    app = TxMsg(config)
    app.add_transactional_listener(PayOrder(sessions), group=GROUP, topics=[TOPIC])
    api = FastAPI(title="txmsg sample: orders", lifespan=lifespan(app))

    @api.post("/orders", status_code=201)
    async def create_order(new: NewOrder) -> OrderView:
        order = Order(
            id=uuid.uuid4().hex, item=new.item, amount_cents=new.amount_cents, status="NEW"
        )
        async with sessions() as session, session.begin():
            session.add(order)
        return _view(order)

    @api.get("/orders/{order_id}")
    async def get_order(order_id: str) -> OrderView:
        async with sessions() as session:
            order = await session.get(Order, order_id)
        if order is None:
            raise HTTPException(404, f"no order {order_id}")
        return _view(order)

    @api.post("/orders/{order_id}/pay")
    async def pay(order_id: str, producer: OrderProducer) -> OrderView:
        async with sessions() as session:
            order = await session.get(Order, order_id)
        if order is None:
            raise HTTPException(404, f"no order {order_id}")
        if order.status != "NEW":
            raise HTTPException(409, f"order {order_id} is {order.status}")
        result = await producer.send_in_transaction(
            TOPIC,
            {"order_id": order.id, "amount_cents": order.amount_cents},
            arg=order.id,
            keys=order.id,
        )
        if result.local_state is not LocalTransactionState.COMMIT:
            raise HTTPException(409, f"order {order_id} was not paid ({result.local_state})")
        async with sessions() as session:
            paid = await session.get(Order, order_id)
        assert paid is not None  # noqa: S101 - committed just now
        return _view(paid, result.transaction_key)

    return api, app


def _view(order: Order, transaction_key: str | None = None) -> OrderView:
    return OrderView(
        id=order.id,
        item=order.item,
        amount_cents=order.amount_cents,
        status=order.status,
        transaction_key=transaction_key,
    )
