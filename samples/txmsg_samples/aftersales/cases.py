"""After-sales service: decides liability, pays refunds, closes cases - and publishes each step.

Why not ``send_in_transaction``: a transactional message is not an ordered one (its half message
goes to any queue), and here order is the point.  So every step writes its state change and an
*outbox* row in ONE database transaction, and :meth:`AfterSalesService.publish` sends the order's
unsent rows with ``send_orderly(..., sharding_key=order_id)`` in ``seq`` order:

* crash after the commit, before the send: the row stays unsent; :meth:`publish_pending` (run it
  at start-up and every few seconds) sends it - nothing is lost;
* crash after the send, before the row is marked sent: it is sent again; the consumer sees a
  ``seq`` it already applied and skips it - nothing is applied twice;
* two publishers of one order: the unsent rows are read ``FOR UPDATE`` (PostgreSQL row locks;
  SQLite writers are serialised), so the second waits and then finds them sent - never reordered.

The sends run inside that database transaction (milliseconds each): simple and correct, at the
price of holding the order's rows (on SQLite: the write lock) while the broker answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from sqlalchemy import DateTime, Integer, LargeBinary, String, UniqueConstraint, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txmsg.sqla import SessionFactory
from txmsg_samples.aftersales.events import (
    CASE_CLOSED,
    LIABILITY_DECIDED,
    REFUND_PAID,
    TOPIC,
    AfterSalesEvent,
    Party,
)

OPEN, DECIDED, REFUNDED, CLOSED = "OPEN", "DECIDED", "REFUNDED", "CLOSED"


class CasesBase(DeclarativeBase):
    pass


class AfterSalesCase(CasesBase):
    __tablename__ = "aftersales_case"

    case_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    merchant_id: Mapped[str] = mapped_column(String(64))
    refund_cents: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=OPEN)
    liable: Mapped[str | None] = mapped_column(String(16), nullable=True)


class OutboxEvent(CasesBase):
    """An event committed with its state change, sent afterwards in ``seq`` order per order."""

    __tablename__ = "aftersales_outbox"
    __table_args__ = (UniqueConstraint("order_id", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    body: Mapped[bytes] = mapped_column(LargeBinary)
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class CaseStateError(Exception):
    """The step does not follow from the case's state (e.g. paying before deciding)."""


class OrderedPublisher(Protocol):
    """What the service needs of a txmsg ``Producer``."""

    def send_orderly(
        self,
        topic: str,
        payload: Any,
        *,
        sharding_key: str,
        keys: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> Any: ...


class AfterSalesService:
    """The after-sales service's use cases.  ``producer`` is ``app.producer(PRODUCER_GROUP)``."""

    def __init__(self, producer: OrderedPublisher, sessions: SessionFactory) -> None:
        self.producer = producer
        self.sessions = sessions

    # ---- use cases ------------------------------------------------------------------------------
    def open_case(self, case_id: str, order_id: str, merchant_id: str, refund_cents: int) -> None:
        """A buyer asks for ``refund_cents`` back on ``order_id`` (no event: nothing decided yet)."""
        if refund_cents <= 0:
            raise ValueError("refund_cents must be positive")
        with self.sessions() as session, session.begin():
            session.add(
                AfterSalesCase(
                    case_id=case_id,
                    order_id=order_id,
                    merchant_id=merchant_id,
                    refund_cents=refund_cents,
                    status=OPEN,
                )
            )

    def decide_liability(self, case_id: str, liable: Party) -> AfterSalesEvent:
        """Customer service decides who pays the refund; publishes ``LiabilityDecided``."""
        if liable not in ("merchant", "platform"):
            raise ValueError(f"liable must be 'merchant' or 'platform', not {liable!r}")

        def step(case: AfterSalesCase) -> None:
            case.liable = liable

        return self._step(case_id, OPEN, DECIDED, LIABILITY_DECIDED, step)

    def pay_refund(self, case_id: str, payment_ref: str) -> AfterSalesEvent:
        """The payment gateway paid the refund (``payment_ref``); publishes ``RefundPaid``."""
        return self._step(case_id, DECIDED, REFUNDED, REFUND_PAID, None, payment_ref=payment_ref)

    def close_case(self, case_id: str) -> AfterSalesEvent:
        """Nothing left to do on the case; publishes ``CaseClosed``."""
        return self._step(case_id, REFUNDED, CLOSED, CASE_CLOSED, None)

    # ---- publishing -----------------------------------------------------------------------------
    def publish(self, order_id: str) -> int:
        """Send the order's unsent events in ``seq`` order; returns how many were sent.

        A send error propagates and rolls the marks back: those rows are sent again later
        (:meth:`publish_pending`) and the consumer skips the ones it already applied.
        """
        sent = 0
        with self.sessions() as session, session.begin():
            rows = session.scalars(
                select(OutboxEvent)
                .where(OutboxEvent.order_id == order_id, OutboxEvent.sent_at.is_(None))
                .order_by(OutboxEvent.seq)
                .with_for_update()
            ).all()
            for row in rows:
                self.producer.send_orderly(
                    TOPIC, row.body, sharding_key=row.order_id, keys=row.event_id, tags=row.kind
                )
                row.sent_at = datetime.now(UTC)
                sent += 1
        return sent

    def publish_pending(self) -> int:
        """Send every unsent event (after a crash, and periodically); returns how many."""
        with self.sessions() as session:
            orders = session.scalars(
                select(OutboxEvent.order_id).where(OutboxEvent.sent_at.is_(None)).distinct()
            ).all()
        return sum(self.publish(order_id) for order_id in orders)

    def _step(
        self,
        case_id: str,
        expected: str,
        new_status: str,
        kind: str,
        change: Callable[[AfterSalesCase], None] | None,
        payment_ref: str | None = None,
    ) -> AfterSalesEvent:
        with self.sessions() as session, session.begin():
            case = session.get(AfterSalesCase, case_id, with_for_update=True)
            if case is None:
                raise CaseStateError(f"no after-sales case {case_id}")
            if case.status != expected:
                raise CaseStateError(f"case {case_id} is {case.status}; {kind} needs it {expected}")
            if change is not None:
                change(case)
            case.status = new_status
            event = AfterSalesEvent(
                event_id=uuid.uuid4().hex,
                kind=kind,
                order_id=case.order_id,
                case_id=case.case_id,
                seq=_next_seq(session, case.order_id),
                merchant_id=case.merchant_id,
                liable=cast("Party | None", case.liable),  # only ever set from a Party
                refund_cents=case.refund_cents,
                payment_ref=payment_ref,
            )
            session.add(
                OutboxEvent(
                    event_id=event.event_id,
                    order_id=event.order_id,
                    seq=event.seq,
                    kind=kind,
                    body=event.body(),
                )
            )
        self.publish(event.order_id)
        return event


def _next_seq(session: Session, order_id: str) -> int:
    """The order's next event number (the UNIQUE (order_id, seq) stops a concurrent duplicate)."""
    last = session.scalar(select(func.max(OutboxEvent.seq)).where(OutboxEvent.order_id == order_id))
    return int(last or 0) + 1


def case_status(sessions: SessionFactory, case_id: str) -> str | None:
    with sessions() as session:
        case = session.get(AfterSalesCase, case_id)
        return None if case is None else case.status
