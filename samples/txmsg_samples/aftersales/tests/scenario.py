"""The after-sales scenario the broker tests share: many orders, one poisoned, and the checks
that read the settlement database to prove order and exactly-once."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from txmsg import Producer
from txmsg.message import SendResult
from txmsg.sqla import ConsumedMessage
from txmsg_samples.aftersales import settlement
from txmsg_samples.aftersales.cases import AfterSalesService, CaseEvent
from txmsg_samples.aftersales.events import KINDS
from txmsg_samples.aftersales.settlement import MerchantAccount, OrderSettlement

ORDERS = [f"o-{i:02d}" for i in range(12)]
POISONED = "o-05"
MERCHANTS = ["m-0", "m-1", "m-2"]
NEW_MERCHANT = "m-new"
"""The poisoned order's merchant: no settlement account until the operator opens it."""
START_BALANCE = 100_000


def merchant_of(order_id: str) -> str:
    return NEW_MERCHANT if order_id == POISONED else MERCHANTS[int(order_id[2:]) % len(MERCHANTS)]


def refund_of(order_id: str) -> int:
    return 1_000 + 10 * int(order_id[2:])


class QueueRecorder:
    """The outbox relay's sender in the tests: the real producer, remembering the queue each
    sharding key went to (``SendResult.queue_id``)."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.queues: dict[str, set[int | None]] = defaultdict(set)
        self._lock = threading.Lock()

    def send_orderly_async(
        self,
        topic: str,
        payload: Any,
        *,
        sharding_key: str,
        keys: str | Sequence[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, Any] | None = None,
    ) -> Future[SendResult]:
        future = self.producer.send_orderly_async(
            topic, payload, sharding_key=sharding_key, keys=keys, tags=tags, properties=properties
        )

        def note(done: Future[SendResult]) -> None:
            if done.exception() is None:
                with self._lock:
                    self.queues[sharding_key].add(done.result().queue_id)

        future.add_done_callback(note)
        return future

    def send_async(
        self,
        topic: str,
        payload: Any,
        *,
        keys: str | Sequence[str] | None = None,
        tags: str | None = None,
        properties: Mapping[str, Any] | None = None,
        delay_level: int | None = None,
        deliver_at: datetime | float | None = None,
    ) -> Future[SendResult]:
        return self.producer.send_async(
            topic,
            payload,
            keys=keys,
            tags=tags,
            properties=properties,
            delay_level=delay_level,
            deliver_at=deliver_at,
        )


def open_accounts(db: sessionmaker[Session]) -> None:
    with db() as session, session.begin():
        for merchant in MERCHANTS:
            settlement.open_account(session, merchant, START_BALANCE)


def run_cases(service: AfterSalesService, orders: Sequence[str] = ORDERS) -> None:
    """One merchant-liable case per order; each step for every order before the next step, so
    the orders' events are interleaved in their queues."""
    for order_id in orders:
        service.open_case(f"c-{order_id}", order_id, merchant_of(order_id), refund_of(order_id))
    for order_id in orders:
        service.decide_liability(f"c-{order_id}", "merchant")
    for order_id in orders:
        service.pay_refund(f"c-{order_id}", f"pay-{order_id}")
    for order_id in orders:
        service.close_case(f"c-{order_id}")


def applied_seq(db: sessionmaker[Session]) -> dict[str, int]:
    with db() as session:
        return {o.order_id: o.applied_seq for o in session.scalars(select(OrderSettlement))}


def others_done(db: sessionmaker[Session], orders: Sequence[str] = ORDERS) -> bool:
    seqs = applied_seq(db)
    return all(seqs.get(o) == len(KINDS) for o in orders if o != POISONED)


def assert_applied_once_in_order(
    cases_db: sessionmaker[Session], settlement_db: sessionmaker[Session]
) -> None:
    """Every event the after-sales service committed is in the ledger exactly once, each order's
    events in seq order 1..n, and each merchant was charged each refund once."""
    with cases_db() as session:
        sent = {(e.order_id, e.seq, e.kind, e.event_id) for e in session.scalars(select(CaseEvent))}
    with settlement_db() as session:
        entries = settlement.ledger(session)
        per_order: dict[str, list[int]] = defaultdict(list)
        for entry in entries:
            per_order[entry.order_id].append(entry.seq)
        assert {(e.order_id, e.seq, e.kind, e.event_id) for e in entries} == sent
        assert len(entries) == len(sent), "an event was applied twice"
        for order_id, seqs in per_order.items():
            assert seqs == list(range(1, len(seqs) + 1)), f"order {order_id} applied as {seqs}"
        charged: dict[str, int] = defaultdict(int)
        for entry in entries:
            if entry.kind == "RefundPaid" and entry.party == "merchant":
                charged[merchant_of(entry.order_id)] += entry.amount_cents
        for account in session.scalars(select(MerchantAccount)):
            start = 0 if account.merchant_id == NEW_MERCHANT else START_BALANCE
            assert account.balance_cents == start - charged[account.merchant_id]
        dedup_rows = session.scalar(
            select(func.count())
            .select_from(ConsumedMessage)
            .where(ConsumedMessage.consumer_group == settlement.GROUP)
        )
        assert dedup_rows == len(sent)
