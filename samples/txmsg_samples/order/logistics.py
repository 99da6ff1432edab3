"""Logistics service: creates one shipment per paid order, in its own database."""

from __future__ import annotations

from sqlalchemy import String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txmsg.message import Message
from txmsg_samples.order.events import OrderPaid

GROUP = "logistics-service"


class LogisticsBase(DeclarativeBase):
    pass


class Shipment(LogisticsBase):
    __tablename__ = "shipments"

    order_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64))
    skus: Mapped[str] = mapped_column(String(2000))
    status: Mapped[str] = mapped_column(String(16), default="READY")


def create_shipment(session: Session, event: OrderPaid) -> Shipment:
    shipment = Shipment(
        order_id=event.order_id, user_id=event.user_id, skus=",".join(event.skus), status="READY"
    )
    session.add(shipment)
    return shipment


def on_order_paid(message: Message, session: Session) -> None:
    create_shipment(session, OrderPaid.from_message(message))


def shipments(session: Session) -> dict[str, str]:
    return {s.order_id: s.skus for s in session.scalars(select(Shipment))}
