"""The order service: its tables, ``OrderService.pay`` and the local transaction behind it.

``pay`` publishes ``OrderPaid`` with ``send_in_transaction``; the broker stores it as a half
message and the producer runs :class:`PaymentListener`'s local transaction: mark the order PAID
and write the transaction record in one database transaction.  COMMIT delivers the event, a
failure rolls both back and the event is never delivered; a check-back reads the record.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from injector import inject
from sqlalchemy import DateTime, ForeignKey, Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from txmsg.message import Message
from txmsg.sqla import RecordBackedListener, born_properties
from txmsg_samples.order.events import TAG, TOPIC, OrderPaid
from txmsg_samples.order.keys import ORDER_GROUP, OrderProducer, OrdersDb, OrderTopic

CREATED, PAID = "CREATED", "PAID"


class OrderBase(DeclarativeBase):
    pass


class Order(OrderBase):
    __tablename__ = "orders"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64))
    amount_cents: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=CREATED)
    paid_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    paid_by_message: Mapped[str | None] = mapped_column(String(128), default=None)
    lines: Mapped[list[OrderLine]] = relationship(
        back_populates="order", order_by="OrderLine.sku", lazy="selectin"
    )


class OrderLine(OrderBase):
    __tablename__ = "order_lines"

    order_id: Mapped[str] = mapped_column(ForeignKey("orders.id"), primary_key=True)
    sku: Mapped[str] = mapped_column(String(64), primary_key=True)
    quantity: Mapped[int] = mapped_column(Integer, default=1)
    order: Mapped[Order] = relationship(back_populates="lines")


class OrderError(Exception):
    """Base of the order service's business errors."""


class OrderNotFound(OrderError):
    pass


class OrderNotPayable(OrderError):
    """The order is not in CREATED state (already paid, or cancelled)."""


def create_order(
    session: Session, order_id: str, user_id: str, amount_cents: int, skus: list[str]
) -> Order:
    """Add a new CREATED order with one line per SKU (the caller commits)."""
    if amount_cents <= 0:
        raise ValueError("amount_cents must be positive")
    order = Order(id=order_id, user_id=user_id, amount_cents=amount_cents, status=CREATED)
    order.lines = [OrderLine(sku=sku, quantity=1) for sku in skus]
    session.add(order)
    return order


def order_paid_event(order: Order) -> OrderPaid:
    return OrderPaid(
        order_id=order.id,
        user_id=order.user_id,
        amount_cents=order.amount_cents,
        skus=[line.sku for line in order.lines],
    )


def mark_paid(session: Session, order_id: str, message_key: str | None) -> Order:
    """The business change of a payment (inside the caller's transaction).

    The row is locked (``FOR UPDATE``) so two payments of one order cannot both see CREATED."""
    order = session.get(Order, order_id, with_for_update=True)
    if order is None:
        raise OrderNotFound(f"order {order_id} does not exist")
    if order.status != CREATED:
        raise OrderNotPayable(f"order {order_id} is {order.status}, not {CREATED}")
    order.status = PAID
    order.paid_at = datetime.now(UTC)
    order.paid_by_message = message_key
    return order


class OrderService:
    """Application service: ``pay(order_id)`` is all a controller calls.

    Built by ``injector``: the producer of ``order-tx``, the orders database and the topic are
    injected (see wiring.py); tests pass any object with ``send_in_transaction``.
    """

    @inject
    def __init__(
        self, producer: OrderProducer, sessions: OrdersDb, topic: OrderTopic = TOPIC
    ) -> None:
        self.producer = producer
        self.sessions = sessions
        self.topic = topic

    def pay(self, order_id: str) -> Any:
        """Mark the order paid and publish OrderPaid, atomically; returns the send result
        (``result.local_state`` says COMMIT, ROLLBACK or UNKNOW)."""
        with self.sessions() as session:
            order = session.get(Order, order_id)
            if order is None:
                raise OrderNotFound(f"order {order_id} does not exist")
            if order.status != CREATED:
                raise OrderNotPayable(f"order {order_id} is {order.status}, not {CREATED}")
            event = order_paid_event(order)
        return self.producer.send_in_transaction(
            self.topic,
            event.to_json(),
            arg=order_id,
            keys=order_id,
            tags=TAG,
            # lets the record check tell "not started yet" from "never happened"
            properties=born_properties(),
        )

    def status(self, order_id: str) -> str | None:
        with self.sessions() as session:
            return session.scalar(select(Order.status).where(Order.id == order_id))


class PaymentListener(RecordBackedListener):
    """Local transaction of ``order-tx``: the order row and the transaction record commit together;
    check-backs answer from the record (inherited ``check_local``)."""

    producer_group = ORDER_GROUP

    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
        order_id = str(arg) if arg is not None else OrderPaid.from_message(message).order_id
        mark_paid(session, order_id, message.transaction_key)
