"""After-sales service: decides liability, pays refunds, closes cases - and publishes each step.

Why not ``send_in_transaction``: a transactional message is not an ordered one (its half message
goes to any queue), and here order is the point.  So every step writes its state change, its
event (:class:`CaseEvent`, the order's numbered history) and the event's message through txmsg's
transactional outbox (:meth:`txmsg.sqla.outbox.Outbox.send`) in ONE database transaction; the
outbox's relay sends the message after the commit with ``send_orderly(sharding_key=order_id)``,
an order's events one at a time in the order their transactions committed:

* crash before the commit: nothing was written, nothing is sent;
* crash after the commit, before the send: the outbox row stays; the relay (of this process
  after a restart, or of another instance) sends it - nothing is lost;
* crash after the send, before the row was marked sent: it is sent again with the same
  ``TXMSG_DEDUP_KEY``; the settlement service's idempotent listener absorbs the copy (and would
  skip a ``seq`` it already applied anyway) - nothing is applied twice;
* the broker down: the steps still commit; their messages wait in the outbox.

Two steps of one order at once: the case row is locked (``with_for_update``) and the outbox
numbers an order's rows under a lock of its own, so the order's events keep their ``seq`` order.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import cast

from sqlalchemy import Integer, String, UniqueConstraint, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txmsg.sqla import SessionFactory
from txmsg.sqla.outbox import Outbox
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


class CaseEvent(CasesBase):
    """An event of an order as the service committed it: ``seq`` 1, 2, 3 ... per order.  Its
    message goes through the outbox in the same transaction."""

    __tablename__ = "aftersales_event"
    __table_args__ = (UniqueConstraint("order_id", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))


class CaseStateError(Exception):
    """The step does not follow from the case's state (e.g. paying before deciding)."""


class AfterSalesService:
    """The after-sales service's use cases.  ``outbox`` is the app's outbox
    (``app.outboxes[PRODUCER_GROUP]``, see :func:`txmsg_samples.aftersales.app.aftersales_app`);
    ``sessions`` the service's database, the outbox's too."""

    def __init__(self, outbox: Outbox, sessions: SessionFactory) -> None:
        self.outbox = outbox
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
                CaseEvent(
                    event_id=event.event_id, order_id=event.order_id, seq=event.seq, kind=kind
                )
            )
            # the message, in this transaction: the relay sends it after the commit
            self.outbox.send(
                session,
                TOPIC,
                event.body(),
                sharding_key=event.order_id,
                keys=event.event_id,
                tags=kind,
            )
        return event


def _next_seq(session: Session, order_id: str) -> int:
    """The order's next event number (the UNIQUE (order_id, seq) stops a concurrent duplicate)."""
    last = session.scalar(select(func.max(CaseEvent.seq)).where(CaseEvent.order_id == order_id))
    return int(last or 0) + 1


def events(sessions: SessionFactory, order_id: str | None = None) -> list[CaseEvent]:
    """The committed events (of one order), by order and ``seq``."""
    query = select(CaseEvent).order_by(CaseEvent.order_id, CaseEvent.seq)
    if order_id is not None:
        query = query.where(CaseEvent.order_id == order_id)
    with sessions() as session:
        return list(session.scalars(query))


def case_status(sessions: SessionFactory, case_id: str) -> str | None:
    with sessions() as session:
        case = session.get(AfterSalesCase, case_id)
        return None if case is None else case.status
