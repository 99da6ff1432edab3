"""Cart service: removes bought items from the user's cart once the order is paid."""

from __future__ import annotations

from sqlalchemy import Integer, String, delete, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txmsg.message import Message
from txmsg_samples.order.events import OrderPaid

GROUP = "cart-service"


class CartBase(DeclarativeBase):
    pass


class CartItem(CartBase):
    __tablename__ = "cart_items"

    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    sku: Mapped[str] = mapped_column(String(64), primary_key=True)
    quantity: Mapped[int] = mapped_column(Integer, default=1)


class CartCheckout(CartBase):
    """One row per order whose items were removed (what the demo's consistency check reads)."""

    __tablename__ = "cart_checkouts"

    order_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64))
    removed: Mapped[int] = mapped_column(Integer)


def add_to_cart(session: Session, user_id: str, sku: str, quantity: int = 1) -> None:
    item = session.get(CartItem, (user_id, sku), with_for_update=True)
    if item is None:
        session.add(CartItem(user_id=user_id, sku=sku, quantity=quantity))
    else:
        item.quantity += quantity


def checkout(session: Session, event: OrderPaid) -> int:
    """Remove the order's SKUs from the user's cart; returns how many lines went."""
    removed = 0
    if event.skus:
        result = session.execute(
            delete(CartItem).where(CartItem.user_id == event.user_id, CartItem.sku.in_(event.skus))
        )
        removed = int(getattr(result, "rowcount", 0) or 0)
    session.add(CartCheckout(order_id=event.order_id, user_id=event.user_id, removed=removed))
    return removed


def on_order_paid(message: Message, session: Session) -> None:
    checkout(session, OrderPaid.from_message(message))


def items(session: Session) -> set[tuple[str, str]]:
    return {(i.user_id, i.sku) for i in session.scalars(select(CartItem))}


def checkouts(session: Session) -> dict[str, int]:
    return {c.order_id: c.removed for c in session.scalars(select(CartCheckout))}
