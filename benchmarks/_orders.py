"""The business row of the benchmarks' transactions: one ORM ``INSERT`` of an order row, the
work a transactional send or an outbox send is there to make consistent (``outbox_throughput``
compares the outbox with it, ``otel_overhead`` and ``otel_cost`` write it in ``execute_local``)."""

from __future__ import annotations

from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class OrderBase(DeclarativeBase):
    """The metadata of :class:`BenchOrder` (``OrderBase.metadata.create_all(engine)``)."""


class BenchOrder(OrderBase):
    """One business row."""

    __tablename__ = "bench_order"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ref: Mapped[str] = mapped_column(String(64))
