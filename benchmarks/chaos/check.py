"""What the chaos run proves, read from the four databases and nothing else.

Sets (all of order ids):

* ``paid`` - orders PAID in the orders database: the local transactions that committed;
* ``acked`` - orders whose producer journal says ``pay`` returned COMMIT (the seed's
  "committed": the producer was told so);
* ``in_doubt`` - attempted orders whose producer never learned a final answer: it died
  mid-transaction (no outcome), got UNKNOW, or the send failed;
* ``processed[s]`` - orders service ``s`` applied (its effect table).

Invariants (each failure is one line naming the order):

* every paid order is processed exactly once by points, logistics and cart, with the right
  content (points balance, shipment lines, cart lines removed);
* no order that is not paid is processed anywhere, and no planned failure is paid;
* ``acked <= processed <= acked + in_doubt`` per service, and ``acked`` is a subset of ``paid``;
* no transaction record is still IN_FLIGHT once the run settled;
* a PAID order points at a COMMITTED transaction record;
* the ordered stream (:mod:`benchmarks.chaos.tracking`, from the orders journal and the tracking
  database): per order, events applied in sequence order without gaps, every acknowledged event
  applied exactly once, nothing applied that was not sent, no key parked.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from txmsg_samples.order import cart, logistics, points
from txmsg_samples.order.orders import PAID, Order

from benchmarks.chaos import tracking
from benchmarks.chaos.databases import attempts
from benchmarks.chaos.roles import fault_of
from benchmarks.chaos.settings import ChaosSettings
from txmsg.sqla import RecordState, TransactionRecord, consumed_count, duplicates_absorbed

SERVICE_GROUPS = {"points": points.GROUP, "logistics": logistics.GROUP, "cart": cart.GROUP}


@dataclass
class Snapshot:
    orders: int = 0
    attempted: int = 0
    paid: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    rolled_back: set[str] = field(default_factory=set)
    in_doubt: set[str] = field(default_factory=set)
    in_flight_records: int = 0
    processed: dict[str, set[str]] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    stream: tracking.Stream = field(default_factory=tracking.Stream)
    """The ordered stream: events sent (journal) and applied (tracking database)."""
    stream_duplicates: int = 0
    """Redeliveries the tracking service's idempotent wrapper absorbed."""
    violations: list[str] = field(default_factory=list)

    @property
    def caught_up(self) -> bool:
        """Nothing left to arrive: no record in flight, every service saw every paid order and
        the tracking service applied every acknowledged event."""
        return (
            self.in_flight_records == 0
            and all(got == self.paid for got in self.processed.values())
            and self.stream.caught_up
        )

    def equations(self) -> list[str]:
        """The seed's bounds, per service; empty when they hold."""
        out = []
        low, high = len(self.acked), len(self.acked | self.in_doubt)
        for service, got in self.processed.items():
            if not low <= len(got) <= high:
                out.append(
                    f"{service}: processed {len(got)} is outside [committed {low}, "
                    f"committed + in doubt {high}]"
                )
        return out


def snapshot(dbs: dict[str, sessionmaker[Session]]) -> Snapshot:
    """Counts only (cheap enough to poll while the run settles)."""
    snap = Snapshot()
    with dbs["orders"]() as session:
        status = {oid: state for oid, state in session.execute(select(Order.id, Order.status))}
        snap.in_flight_records = int(
            session.scalar(
                select(func.count()).where(TransactionRecord.state == RecordState.IN_FLIGHT.value)
            )
            or 0
        )
    snap.orders = len(status)
    snap.paid = {oid for oid, s in status.items() if s == PAID}
    outcomes: dict[str, set[str | None]] = defaultdict(set)
    for order_id, outcome in attempts(dbs["orders"]):
        outcomes[order_id].add(outcome)
    snap.attempted = len(outcomes)
    for order_id, seen in outcomes.items():
        if "COMMIT" in seen:
            snap.acked.add(order_id)
        elif seen & {None, "UNKNOW", "ERROR"}:
            snap.in_doubt.add(order_id)
        else:
            snap.rolled_back.add(order_id)
    with dbs["points"]() as session:
        snap.processed["points"] = set(points.entries(session))
    with dbs["logistics"]() as session:
        snap.processed["logistics"] = set(logistics.shipments(session))
    with dbs["cart"]() as session:
        snap.processed["cart"] = set(cart.checkouts(session))
    for service, group in SERVICE_GROUPS.items():
        snap.applied[service] = consumed_count(dbs[service], group)
        snap.duplicates[service] = duplicates_absorbed(dbs[service], group)
    snap.stream = tracking.read(dbs["orders"], dbs["tracking"])
    snap.stream_duplicates = duplicates_absorbed(dbs["tracking"], tracking.GROUP)
    return snap


def verify(dbs: dict[str, sessionmaker[Session]], settings: ChaosSettings) -> Snapshot:
    """The full check after the run settled; fills ``violations``."""
    snap = snapshot(dbs)
    bad = snap.violations
    with dbs["orders"]() as session:
        orders = {o.id: o for o in session.scalars(select(Order))}
        records = {r.transaction_key: r.state for r in session.scalars(select(TransactionRecord))}
        lines = {oid: sorted(line.sku for line in o.lines) for oid, o in orders.items()}
    paid = snap.paid

    for oid in sorted(paid):
        key = orders[oid].paid_by_message
        if records.get(key or "") != RecordState.COMMITTED.value:
            bad.append(f"order {oid}: PAID by {key}, whose record is {records.get(key or '')}")
        if fault_of(settings, oid)[0] == "fail":
            bad.append(f"order {oid}: its local transaction always fails, yet it is PAID")
    for oid in sorted(snap.acked - paid):
        bad.append(f"order {oid}: the producer was told COMMIT but the order is not PAID")
    for oid in sorted(paid - snap.acked - snap.in_doubt):
        bad.append(f"order {oid}: PAID although every attempt was answered ROLLBACK")
    for key, state in sorted(records.items()):
        if state == RecordState.IN_FLIGHT.value:
            bad.append(f"record {key}: still IN_FLIGHT after the run settled (never resolved)")

    for service, got in snap.processed.items():
        for oid in sorted(paid - got):
            bad.append(f"order {oid}: PAID but {service} never processed it")
        for oid in sorted(got - paid):
            bad.append(f"order {oid}: not PAID but {service} processed it")
        if snap.applied[service] != len(got):
            bad.append(
                f"{service}: {snap.applied[service]} messages applied for {len(got)} effects "
                "(a message applied twice or without its effect)"
            )
    bad.extend(snap.equations())
    bad.extend(tracking.verify(snap.stream, paid))

    # exactly one effect: a second application would show in balances and cart contents
    expected_balance: dict[str, int] = defaultdict(int)
    for oid in paid:
        expected_balance[orders[oid].user_id] += points.points_for(orders[oid].amount_cents)
    with dbs["points"]() as session:
        entries = points.entries(session)
        balances = {b.user_id: b.points for b in session.scalars(select(points.PointsBalance))}
    for oid in sorted(set(entries) & paid):
        if entries[oid] != points.points_for(orders[oid].amount_cents):
            bad.append(f"order {oid}: {entries[oid]} points for {orders[oid].amount_cents} cents")
    for user in sorted(set(expected_balance) | set(balances)):
        if balances.get(user, 0) != expected_balance.get(user, 0):
            bad.append(
                f"user {user}: {balances.get(user, 0)} points, expected {expected_balance[user]}"
            )
    with dbs["logistics"]() as session:
        ships = logistics.shipments(session)
    for oid in sorted(set(ships) & paid):
        if sorted(s for s in ships[oid].split(",") if s) != lines[oid]:
            bad.append(f"order {oid}: shipment lists {ships[oid]}, order has {lines[oid]}")
    with dbs["cart"]() as session:
        in_cart = cart.items(session)
    for oid, order in sorted(orders.items()):
        for sku in lines[oid]:
            present = (order.user_id, sku) in in_cart
            if oid in paid and present:
                bad.append(f"order {oid}: PAID but {sku} is still in the cart")
            if oid not in paid and not present:
                bad.append(f"order {oid}: not PAID but {sku} left the cart")
    return snap
