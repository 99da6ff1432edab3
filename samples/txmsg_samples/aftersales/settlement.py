"""Settlement service: books who pays each refund - strictly in the order the cases decided it.

Consumed with ``@message_listener(orderly=True, idempotent=True, ...)`` (see ``app.py``): the
events of one order arrive one at a time, in ``seq`` order, and each is applied together with its
dedup row in one database transaction.

* ``LiabilityDecided``: remember who pays.  A merchant without a settlement account cannot be
  charged: :class:`UnknownMerchant` - the sample's poison message.  It fails every retry, the
  order is parked with every later event of it, and once the account exists
  ``txmsg parked retry`` applies them in order.
* ``RefundPaid``: charge the liable party.  Without a decision it raises
  :class:`LiabilityNotDecided`: the refund-before-decision bug that ordered consumption prevents.
* ``CaseClosed``: only after the refund.

Every applied event leaves one :class:`LedgerEntry`; its autoincrement id is the order in which
events were applied, which the tests read to prove nothing was reordered or applied twice.
"""

from __future__ import annotations

import logging

from sqlalchemy import Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from txmsg.message import Message
from txmsg_samples.aftersales.events import (
    CASE_CLOSED,
    LIABILITY_DECIDED,
    REFUND_PAID,
    AfterSalesEvent,
)

GROUP = "aftersales-settlement"
"""Consumer group (and the group parked keys are listed under).  Not ``settlement-service``:
librocketmq 2.1.0 logs the retry topic ``%RETRY%<group>`` as a printf format, and ``%RETRY%s...``
crashes it (txmsg refuses such names; see :mod:`txmsg.names`)."""

log = logging.getLogger("txmsg_samples.aftersales.settlement")


class SettlementBase(DeclarativeBase):
    pass


class MerchantAccount(SettlementBase):
    """A merchant's settlement account: refunds it is liable for are deducted here."""

    __tablename__ = "merchant_account"

    merchant_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    balance_cents: Mapped[int] = mapped_column(Integer, default=0)


class OrderSettlement(SettlementBase):
    """What the settlement service knows of one order's after-sales events."""

    __tablename__ = "order_settlement"

    order_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    applied_seq: Mapped[int] = mapped_column(Integer, default=0)
    """The last event applied: the next must be applied_seq + 1."""
    liable: Mapped[str | None] = mapped_column(String(16), nullable=True)
    refunded_cents: Mapped[int] = mapped_column(Integer, default=0)
    platform_cost_cents: Mapped[int] = mapped_column(Integer, default=0)
    closed_cases: Mapped[int] = mapped_column(Integer, default=0)


class LedgerEntry(SettlementBase):
    """One applied event; ``id`` order = application order."""

    __tablename__ = "settlement_ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    case_id: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    party: Mapped[str | None] = mapped_column(String(16), nullable=True)
    amount_cents: Mapped[int] = mapped_column(Integer, default=0)


class UnknownMerchant(Exception):
    """The merchant has no settlement account yet: fix the data, then replay the order."""


class LiabilityNotDecided(Exception):
    """A refund arrived before its liability decision: the out-of-order bug."""


class OutOfOrder(Exception):
    """An event arrived while an earlier event of its order is not applied yet."""


def on_aftersales_event(message: Message, session: Session) -> None:
    """The orderly consumer body: apply one event inside the listener's transaction."""
    event = AfterSalesEvent.from_body(message.body)
    order = session.get(OrderSettlement, event.order_id, with_for_update=True)
    if order is None:
        order = OrderSettlement(
            order_id=event.order_id,
            applied_seq=0,
            refunded_cents=0,
            platform_cost_cents=0,
            closed_cases=0,
        )
        session.add(order)
    if event.seq <= order.applied_seq:
        # the after-sales service sent it again (it crashed before marking the send)
        log.info(
            "order %s: event %s seq %d already applied, skipped",
            event.order_id,
            event.event_id,
            event.seq,
        )
        return
    if event.seq != order.applied_seq + 1:
        raise OutOfOrder(
            f"order {event.order_id}: got {event.kind} seq {event.seq} but applied only up to "
            f"seq {order.applied_seq}"
        )
    party: str | None = None
    amount = 0
    if event.kind == LIABILITY_DECIDED:
        if event.liable == "merchant" and session.get(MerchantAccount, event.merchant_id) is None:
            raise UnknownMerchant(
                f"merchant {event.merchant_id} has no settlement account; create it, then "
                f"replay order {event.order_id}"
            )
        order.liable = event.liable
        party = event.liable
    elif event.kind == REFUND_PAID:
        if order.liable is None:
            raise LiabilityNotDecided(
                f"order {event.order_id}: refund {event.payment_ref} paid before any liability "
                "decision"
            )
        party, amount = order.liable, event.refund_cents
        if party == "merchant":
            account = session.get(MerchantAccount, event.merchant_id, with_for_update=True)
            if account is None:
                raise UnknownMerchant(f"merchant {event.merchant_id} has no settlement account")
            account.balance_cents -= amount
        else:
            order.platform_cost_cents += amount
        order.refunded_cents += amount
    elif event.kind == CASE_CLOSED:
        if order.refunded_cents <= 0:
            raise OutOfOrder(f"order {event.order_id}: case {event.case_id} closed before refund")
        order.closed_cases += 1
    order.applied_seq = event.seq
    session.add(
        LedgerEntry(
            event_id=event.event_id,
            order_id=event.order_id,
            case_id=event.case_id,
            seq=event.seq,
            kind=event.kind,
            party=party,
            amount_cents=amount,
        )
    )


def open_account(session: Session, merchant_id: str, balance_cents: int = 0) -> None:
    """Onboard a merchant for settlement (what fixes the sample's poison message)."""
    session.add(MerchantAccount(merchant_id=merchant_id, balance_cents=balance_cents))


def ledger(session: Session, order_id: str | None = None) -> list[LedgerEntry]:
    """Applied events in application order (all orders, or one)."""
    query = select(LedgerEntry).order_by(LedgerEntry.id)
    if order_id is not None:
        query = query.where(LedgerEntry.order_id == order_id)
    return list(session.scalars(query))
