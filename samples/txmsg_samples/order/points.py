"""Points service: awards loyalty points for every paid order, in its own database."""

from __future__ import annotations

from sqlalchemy import Integer, String, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txmsg.message import Message
from txmsg_samples.order.events import OrderPaid

GROUP = "points-service"
CENTS_PER_POINT = 100


class PointsBase(DeclarativeBase):
    pass


class PointsEntry(PointsBase):
    """One row per order that earned points (the audit trail behind the balance)."""

    __tablename__ = "points_entries"

    order_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64))
    points: Mapped[int] = mapped_column(Integer)


class PointsBalance(PointsBase):
    __tablename__ = "points_balances"

    user_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    points: Mapped[int] = mapped_column(Integer, default=0)


def points_for(amount_cents: int) -> int:
    return amount_cents // CENTS_PER_POINT


def award_points(session: Session, event: OrderPaid) -> int:
    """Add the order's points to the user's balance (inside the caller's transaction)."""
    points = points_for(event.amount_cents)
    session.add(PointsEntry(order_id=event.order_id, user_id=event.user_id, points=points))
    # FOR UPDATE: two consumers awarding the same user at once must not both read the old balance
    # (PostgreSQL's READ COMMITTED would lose one update; the chaos run caught it).  A first
    # balance inserted twice at once fails on the primary key and the message is redelivered.
    balance = session.get(PointsBalance, event.user_id, with_for_update=True)
    if balance is None:
        session.add(PointsBalance(user_id=event.user_id, points=points))
    else:
        balance.points += points
    return points


def on_order_paid(message: Message, session: Session) -> None:
    """Idempotent consumer body: txmsg inserts the dedup row in this same transaction."""
    award_points(session, OrderPaid.from_message(message))


def entries(session: Session) -> dict[str, int]:
    return {e.order_id: e.points for e in session.scalars(select(PointsEntry))}


def total_balance(session: Session) -> int:
    return int(session.scalar(select(func.coalesce(func.sum(PointsBalance.points), 0))) or 0)
