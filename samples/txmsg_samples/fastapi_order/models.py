"""The tables of the two services (each would own its database in production; the sample lets
them share one or use two, as the caller chooses)."""

from __future__ import annotations

from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    """An order of the order service: NEW, then PAID by the local transaction."""

    __tablename__ = "fastapi_order"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    item: Mapped[str] = mapped_column(String(200))
    amount_cents: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="NEW")


class Points(Base):
    """Loyalty points of the loyalty service, one row per paid order."""

    __tablename__ = "fastapi_points"
    order_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    points: Mapped[int] = mapped_column(Integer)
