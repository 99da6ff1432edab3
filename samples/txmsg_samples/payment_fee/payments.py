"""Payment service: completes a payment and publishes ``PaymentCompleted`` in one transaction.

This sample shows the decorator style: ``@transactional`` on ``execute_local`` (the method gets
the open session as a fourth argument) plus :class:`~txmsg.sqla.RecordCheck` as ``check_local``.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txmsg.message import Message
from txmsg.sqla import RecordCheck, SessionFactory, transactional
from txmsg.states import LocalTransactionState

GROUP = "payment-tx"
TOPIC = "payment-completed"


class PaymentBase(DeclarativeBase):
    pass


class Payment(PaymentBase):
    __tablename__ = "payments"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    merchant_id: Mapped[str] = mapped_column(String(64))
    amount_cents: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="PENDING")


class PaymentNotPending(Exception):
    pass


class Publisher(Protocol):
    def send_in_transaction(
        self, topic: str, payload: Any, *, arg: Any = None, keys: str | None = None
    ) -> Any: ...


def event_body(payment: Payment) -> bytes:
    return json.dumps(
        {
            "payment_id": payment.id,
            "merchant_id": payment.merchant_id,
            "amount_cents": payment.amount_cents,
        }
    ).encode()


class PaymentService:
    def __init__(self, producer: Publisher, sessions: SessionFactory) -> None:
        self.producer = producer
        self.sessions = sessions

    def complete(self, payment_id: str) -> Any:
        with self.sessions() as session:
            payment = session.get(Payment, payment_id)
            if payment is None or payment.status != "PENDING":
                raise PaymentNotPending(f"payment {payment_id} is not pending")
            body = event_body(payment)
        return self.producer.send_in_transaction(TOPIC, body, arg=payment_id, keys=payment_id)


class PaymentListener:
    """Listener of ``payment-tx`` written with the decorator instead of the base class."""

    producer_group = GROUP

    def __init__(self, session_factory: SessionFactory) -> None:
        self.session_factory = session_factory
        self._check = RecordCheck(session_factory, group=GROUP)

    @transactional()
    def execute_local(self, message: Message, arg: Any, session: Session) -> None:
        payment = session.get(Payment, str(arg), with_for_update=True)  # one completion wins
        if payment is None or payment.status != "PENDING":
            raise PaymentNotPending(f"payment {arg} is not pending")
        payment.status = "COMPLETED"

    def check_local(self, message: Message) -> LocalTransactionState:
        return self._check(message)
