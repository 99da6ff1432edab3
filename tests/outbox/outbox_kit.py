"""What the outbox tests share: the business table they commit beside outbox rows, and readers
of the outbox table."""

from __future__ import annotations

from sqlalchemy import Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from txmsg.sqla import SessionFactory
from txmsg.sqla.outbox import OutboxMessage


class Base(DeclarativeBase):
    pass


class Order(Base):
    """A business row written in the same transaction as outbox rows."""

    __tablename__ = "outbox_test_order"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ref: Mapped[str] = mapped_column(String(64))


def outbox_rows(sessions: SessionFactory, group: str | None = None) -> list[OutboxMessage]:
    """Every row still in the outbox table, by id (detached; their attributes stay readable)."""
    with sessions() as session:
        query = select(OutboxMessage).order_by(OutboxMessage.id)
        if group is not None:
            query = query.where(OutboxMessage.outbox == group)
        found = list(session.scalars(query).all())
        session.expunge_all()
        return found


def bodies_by_seq(sessions: SessionFactory, key: str) -> list[bytes]:
    """The bodies of ``key``'s rows in ``seq`` order (the order the relay sends them)."""
    rows = [r for r in outbox_rows(sessions) if r.sharding_key == key]
    return [r.body for r in sorted(rows, key=lambda r: r.seq or 0)]
