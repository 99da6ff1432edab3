"""Cross-database consistency check of an order-sample run (what the demo prints).

Everything is read back from the four databases; the fault plan says what *should* have
happened, the tally what the listener answered.  Each disagreement becomes one line naming the
order, so "CONSISTENT" is only printed when there is nothing to name.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from txmsg.sqla import RecordState, TransactionRecord, consumed_count, duplicates_absorbed
from txmsg.states import LocalTransactionState
from txmsg_samples.order import cart, logistics, points
from txmsg_samples.order.faults import FaultPlan, Tally
from txmsg_samples.order.orders import PAID, Order
from txmsg_samples.order.points import points_for

CONSUMER_GROUPS = (points.GROUP, logistics.GROUP, cart.GROUP)


@dataclass
class Databases:
    orders: sessionmaker[Session]
    points: sessionmaker[Session]
    logistics: sessionmaker[Session]
    cart: sessionmaker[Session]

    def of_group(self, group: str) -> sessionmaker[Session]:
        return {
            points.GROUP: self.points,
            logistics.GROUP: self.logistics,
            cart.GROUP: self.cart,
        }[group]


@dataclass
class Outcome:
    orders: int = 0
    expected_paid: int = 0
    paid: int = 0
    rolled_back: int = 0
    expected_rolled_back: int = 0
    timed_out: int = 0
    """Planned to succeed, but still in flight past ``in_flight_timeout``: the check fenced them
    and answered ROLLBACK (consistent: neither paid nor delivered)."""
    answered_unknow: int = 0
    resolved_by_check: int = 0
    in_flight: int = 0
    points_entries: int = 0
    shipments: int = 0
    cart_checkouts: int = 0
    applied: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    lost_acks: dict[str, int] = field(default_factory=dict)
    foreign: int = 0
    """Messages of other runs the consumers skipped (on a cluster that already held some)."""
    mismatches: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not self.mismatches

    @property
    def settled(self) -> bool:
        """Nothing left to arrive: no transaction in flight, every consumer caught up, every
        lost ack redelivered."""
        return (
            self.in_flight == 0
            and self.answered_unknow == self.resolved_by_check
            and all(self.applied.get(g, 0) == self.paid for g in CONSUMER_GROUPS)
            and all(self.duplicates.get(g, 0) >= self.lost_acks.get(g, 0) for g in CONSUMER_GROUPS)
        )


def progress(dbs: Databases, tally: Tally) -> Outcome:
    """Cheap counts for the progress display and the "settled?" decision."""
    out = Outcome()
    with dbs.orders() as session:
        out.paid = len(list(session.scalars(select(Order.id).where(Order.status == PAID))))
        out.in_flight = len(
            list(
                session.scalars(
                    select(TransactionRecord.transaction_key).where(
                        TransactionRecord.state == RecordState.IN_FLIGHT.value
                    )
                )
            )
        )
    with tally.lock:
        out.answered_unknow = sum(
            1 for s in tally.execute.values() if s is LocalTransactionState.UNKNOW
        )
        out.lost_acks = dict(tally.crashes)
        out.foreign = tally.foreign
    out.resolved_by_check = len(tally.resolved_by_check())
    for group in CONSUMER_GROUPS:
        out.applied[group] = consumed_count(dbs.of_group(group), group)
        out.duplicates[group] = duplicates_absorbed(dbs.of_group(group), group)
    return out


def verify(dbs: Databases, order_ids: list[str], plan: FaultPlan, tally: Tally) -> Outcome:
    """Full check; fills ``mismatches``."""
    out = progress(dbs, tally)
    bad = out.mismatches
    out.orders = len(order_ids)
    with tally.lock:
        executed = dict(tally.execute)
        order_of_key = dict(tally.order_of_key)
    resolved = tally.resolved_by_check()
    timed_out = {
        order_of_key[key]
        for key, final in resolved.items()
        if final is LocalTransactionState.ROLLBACK and order_of_key.get(key) not in plan.fail
    }
    out.timed_out = len(timed_out)
    expected_paid = {o for o in order_ids if o not in plan.fail and o not in timed_out}
    out.expected_paid = len(expected_paid)
    out.expected_rolled_back = len(order_ids) - len(expected_paid)

    with dbs.orders() as session:
        orders = {o.id: o for o in session.scalars(select(Order))}
        records = {r.transaction_key: r.state for r in session.scalars(select(TransactionRecord))}
        lines = {o.id: sorted(line.sku for line in o.lines) for o in orders.values()}
    paid = {oid for oid, o in orders.items() if o.status == PAID}
    out.paid = len(paid)
    out.rolled_back = len(set(order_ids) - paid)
    for oid in sorted(set(order_ids) - set(orders)):
        bad.append(f"order {oid}: missing from the orders database")
    for oid in sorted(expected_paid - paid):
        bad.append(f"order {oid}: no fault injected but it is {orders[oid].status}, not PAID")
    for oid in sorted(paid - expected_paid):
        bad.append(f"order {oid}: its local transaction failed but it is PAID")

    # transaction records agree with the orders
    committed = {k for k, s in records.items() if s == RecordState.COMMITTED.value}
    paid_by = {orders[oid].paid_by_message: oid for oid in paid}
    for oid in sorted(paid):
        key = orders[oid].paid_by_message
        if key not in committed:
            bad.append(f"order {oid}: PAID by message {key} which has no COMMITTED record")
    for key in sorted(committed - set(paid_by)):
        bad.append(f"record {key}: COMMITTED but no PAID order points at it")
    for key, record_state in sorted(records.items()):
        if record_state == RecordState.IN_FLIGHT.value:
            bad.append(f"record {key}: still IN_FLIGHT after the run settled")

    # what the listener answered agrees with the database
    for key, state in executed.items():
        final = resolved.get(key, state)
        oid = order_of_key.get(key, "?")
        if final is LocalTransactionState.UNKNOW:
            bad.append(f"order {oid}: answered UNKNOW and no check-back resolved it")
        elif (final is LocalTransactionState.COMMIT) != (key in committed):
            bad.append(
                f"order {oid}: broker was told {final.name} but the record is {records.get(key)}"
            )

    # consumers: exactly the paid orders, each applied once with the right content
    with dbs.orders() as session:
        amounts = {o.id: (o.user_id, o.amount_cents) for o in session.scalars(select(Order))}
    with dbs.points() as session:
        entries = points.entries(session)
        balances = {b.user_id: b.points for b in session.scalars(select(points.PointsBalance))}
    out.points_entries = len(entries)
    _same_orders(bad, "points", set(entries), paid)
    expected_balance: dict[str, int] = defaultdict(int)
    for oid in paid:
        user, amount = amounts[oid]
        expected_balance[user] += points_for(amount)
        if oid in entries and entries[oid] != points_for(amount):
            bad.append(f"order {oid}: {entries[oid]} points, expected {points_for(amount)}")
    for user in sorted(set(expected_balance) | set(balances)):
        if balances.get(user, 0) != expected_balance.get(user, 0):
            bad.append(
                f"user {user}: points balance {balances.get(user, 0)}, "
                f"expected {expected_balance.get(user, 0)}"
            )

    with dbs.logistics() as session:
        ships = logistics.shipments(session)
    out.shipments = len(ships)
    _same_orders(bad, "logistics", set(ships), paid)
    for oid in sorted(set(ships) & paid):
        if sorted(s for s in ships[oid].split(",") if s) != lines[oid]:
            bad.append(f"order {oid}: shipment lists {ships[oid]}, order has {lines[oid]}")

    with dbs.cart() as session:
        checkouts = cart.checkouts(session)
        in_cart = cart.items(session)
    out.cart_checkouts = len(checkouts)
    _same_orders(bad, "cart", set(checkouts), paid)
    for oid in sorted(orders):
        user = orders[oid].user_id
        for sku in lines[oid]:
            present = (user, sku) in in_cart
            if oid in paid and present:
                bad.append(f"order {oid}: paid but {sku} is still in the cart")
            if oid not in paid and not present:
                bad.append(f"order {oid}: not paid but {sku} left the cart")

    for group in CONSUMER_GROUPS:
        if out.applied.get(group, 0) != len(paid):
            bad.append(
                f"{group}: applied {out.applied.get(group, 0)} messages for {len(paid)} paid"
            )
        lost = out.lost_acks.get(group, 0)
        if out.duplicates.get(group, 0) < lost:
            bad.append(
                f"{group}: {lost} acks were lost but only {out.duplicates.get(group, 0)} "
                "redeliveries were absorbed"
            )
    return out


def _same_orders(bad: list[str], service: str, got: set[str], paid: set[str]) -> None:
    bad.extend(
        f"order {oid}: PAID but {service} never applied OrderPaid" for oid in sorted(paid - got)
    )
    bad.extend(
        f"order {oid}: not paid but {service} applied OrderPaid" for oid in sorted(got - paid)
    )
