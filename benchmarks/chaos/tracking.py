"""The chaos run's ordered stream: per paid order, a few events sent with ``send_orderly`` (sharding
key = order id) and applied by an orderly, idempotent listener (the ``tracking`` service).

Why it is in the chaos run: order per key is what an orderly consumer promises, and it is lost
exactly where the monkey strikes - a consumer killed after applying a message but before its offset
was committed, a queue whose lock moves to another consumer, a broker restarted under a sender.

* **Sender** (the order-service producers): after ``pay`` returned COMMIT, events ``0..n-1`` of the
  order, one after the other; each attempt is journaled in the orders database *before* the send
  (outcome NULL) and finished after (``OK`` / ``ERROR``).  A failed send is retried with the same
  sequence number (a resend: a new message, so possibly a second copy of an event the broker did
  store); the next event is sent only once the previous one was acknowledged, so the acknowledged
  events of an order are always ``0..a-1`` and at most event ``a`` is in doubt.
* **Listener** (``tracking`` consumers, ``orderly=True, idempotent=True``): applies an event by
  inserting an :class:`OrderEvent` row (its autoincrement id is the order of application).  An
  event of the same order and sequence applied already is a resend: recorded as a
  :class:`SkippedResend` instead.  A redelivery of the same message is absorbed earlier, by the
  idempotent wrapper.
* **Check** (:func:`verify`, from the two databases alone): per order, events were applied in
  sequence order with no gap (``0, 1, 2...`` by application order); every acknowledged event was
  applied exactly once; nothing applied was never sent; a resend skip only for an event that was
  really sent more than once; the sharding key the listener saw is the order id; no key is parked.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, Integer, String, func, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from txmsg.message import Message
from txmsg.sqla import parked_keys
from txmsg.sqla.models import OrderlyInflight, utcnow

log = logging.getLogger("txmsg.chaos")

TOPIC = "order-events"
"""The ordered stream's topic (a FIFO topic: RocketMQ 5 consumes a FIFO group only there)."""
GROUP = "tracking-service"
EVENTS = ("paid", "packed", "shipped")
"""The events of one paid order, in sequence order."""
SEND_ATTEMPTS = 3
"""Attempts per event before the sender gives up on the rest of that order's events."""


class SendJournalBase(DeclarativeBase):
    pass


class EventSend(SendJournalBase):
    """One ``send_orderly`` attempt as the producer saw it (lives in the orders database)."""

    __tablename__ = "chaos_event_sends"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    producer: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str | None] = mapped_column(String(16), default=None)
    """OK when the broker acknowledged it, ERROR if the send raised, NULL if the process died."""


class TrackingBase(DeclarativeBase):
    pass


class OrderEvent(TrackingBase):
    """An event the tracking service applied; ``id`` orders the applications."""

    __tablename__ = "tracking_order_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    event: Mapped[str] = mapped_column(String(32))
    sharding_key: Mapped[str | None] = mapped_column(String(64))
    message_id: Mapped[str | None] = mapped_column(String(128))
    applied_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SkippedResend(TrackingBase):
    """A message carrying an event that was applied already (the sender's retry)."""

    __tablename__ = "tracking_skipped_resends"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    seq: Mapped[int] = mapped_column(Integer)
    message_id: Mapped[str | None] = mapped_column(String(128))


# ---- sender ---------------------------------------------------------------------------------------
def _journal(sessions: sessionmaker[Session], order_id: str, seq: int, producer: str) -> int:
    with sessions() as session, session.begin():
        row = EventSend(order_id=order_id, seq=seq, producer=producer, started_at=utcnow())
        session.add(row)
        session.flush()
        return int(row.id)


def _finish(sessions: sessionmaker[Session], row_id: int, outcome: str) -> None:
    with sessions() as session, session.begin():
        session.execute(update(EventSend).where(EventSend.id == row_id).values(outcome=outcome))


def send_events(producer: Any, sessions: sessionmaker[Session], order_id: str, name: str) -> int:
    """Send the events of paid order ``order_id`` in order with ``producer.send_orderly``;
    returns how many were acknowledged (fewer than all when the broker stayed away)."""
    for seq, event in enumerate(EVENTS):
        for attempt in range(1, SEND_ATTEMPTS + 1):
            row = _journal(sessions, order_id, seq, name)
            try:
                producer.send_orderly(
                    TOPIC,
                    {"order_id": order_id, "seq": seq, "event": event},
                    sharding_key=order_id,
                    keys=f"{order_id}:{seq}",
                )
            except Exception as exc:  # noqa: BLE001 - broker down or restarting: journaled, retried
                log.warning(
                    "%s: event %s/%d attempt %d failed: %s", name, order_id, seq, attempt, exc
                )
                _finish(sessions, row, "ERROR")
                if attempt == SEND_ATTEMPTS:
                    return seq  # the next events would overtake this one: stop the order here
                time.sleep(0.5)
            else:
                _finish(sessions, row, "OK")
                break
    return len(EVENTS)


# ---- listener -------------------------------------------------------------------------------------
def on_order_event(message: Message, session: Session) -> None:
    """The tracking service's orderly, idempotent listener (runs in the idempotent transaction)."""
    data = json.loads(message.body)
    order_id, seq = str(data["order_id"]), int(data["seq"])
    applied = session.scalar(
        select(func.count()).where(OrderEvent.order_id == order_id, OrderEvent.seq == seq)
    )
    if applied:
        session.add(SkippedResend(order_id=order_id, seq=seq, message_id=message.message_id))
        return
    session.add(
        OrderEvent(
            order_id=order_id,
            seq=seq,
            event=str(data["event"]),
            sharding_key=message.sharding_key,
            message_id=message.message_id,
            applied_at=utcnow(),
        )
    )


# ---- check ----------------------------------------------------------------------------------------
@dataclass
class Stream:
    """What the two databases say about the ordered stream."""

    acked: set[tuple[str, int]] = field(default_factory=set)
    in_doubt: set[tuple[str, int]] = field(default_factory=set)
    attempts: dict[tuple[str, int], int] = field(default_factory=dict)
    applied: dict[str, list[tuple[int, str | None]]] = field(default_factory=dict)
    """order -> (seq, sharding key) in application order."""
    skipped: list[tuple[str, int]] = field(default_factory=list)
    parked: list[tuple[str, int, str]] = field(default_factory=list)
    """Parked keys of the tracking group: (key, messages, reason)."""
    inflight_left: int = 0
    """Rows of the tracking group in the in-flight journal (a message whose listener is running,
    or one a killed consumer left for the next consumer or a sweeper to finish)."""

    @property
    def applied_set(self) -> set[tuple[str, int]]:
        return {(oid, seq) for oid, rows in self.applied.items() for seq, _ in rows}

    @property
    def applied_count(self) -> int:
        return sum(len(rows) for rows in self.applied.values())

    @property
    def caught_up(self) -> bool:
        """Every acknowledged event applied, and nothing left in the in-flight journal."""
        return self.acked <= self.applied_set and self.inflight_left == 0


def read(orders: sessionmaker[Session], tracking: sessionmaker[Session]) -> Stream:
    stream = Stream()
    outcomes: dict[tuple[str, int], list[str | None]] = defaultdict(list)
    with orders() as session:
        for oid, seq, outcome in session.execute(
            select(EventSend.order_id, EventSend.seq, EventSend.outcome)
        ):
            outcomes[(oid, seq)].append(outcome)
    for event, seen in outcomes.items():
        stream.attempts[event] = len(seen)  # each attempt may have stored a copy (even an ERROR)
        (stream.acked if "OK" in seen else stream.in_doubt).add(event)
    with tracking() as session:
        for oid, seq, key in session.execute(
            select(OrderEvent.order_id, OrderEvent.seq, OrderEvent.sharding_key).order_by(
                OrderEvent.id
            )
        ):
            stream.applied.setdefault(oid, []).append((seq, key))
        stream.skipped = [
            (oid, seq)
            for oid, seq in session.execute(select(SkippedResend.order_id, SkippedResend.seq))
        ]
        stream.inflight_left = (
            session.scalar(
                select(func.count())
                .select_from(OrderlyInflight)
                .where(OrderlyInflight.consumer_group == GROUP)
            )
            or 0
        )
    stream.parked = [(v.sharding_key, v.messages, v.reason) for v in parked_keys(tracking, GROUP)]
    return stream


RECOVERED_MARK = "left by consumer"
"""What :mod:`txmsg.sqla.journal` logs when it finishes a dead consumer's in-flight message."""
RECOVERY_WAYS = ("handed again", "before the key's next message", "by the sweeper")
"""How the row was finished, as the journal's log line says: the broker handed the message itself
again (no harm done), or it did not (hazard #10: the offset had passed it) and the key's next
message or the sweeper brought it up."""


def recovered_in(logs: Path) -> dict[str, int]:
    """How many in-flight messages of killed tracking consumers another consumer finished, per
    way (counted from the tracking consumers' logs)."""
    counts = dict.fromkeys(RECOVERY_WAYS, 0)
    for log in sorted(logs.glob("tracking-*.log")):
        with log.open("rb") as fh:
            for line in fh:
                if RECOVERED_MARK.encode() not in line:
                    continue
                for way in RECOVERY_WAYS:
                    if way.encode() in line:
                        counts[way] += 1
    return counts


def verify(stream: Stream, paid: set[str]) -> list[str]:
    """The ordered stream's invariants; one line per violation."""
    bad: list[str] = []
    applied = stream.applied_set
    for oid, rows in sorted(stream.applied.items()):
        seqs = [seq for seq, _ in rows]
        if seqs != list(range(len(seqs))):
            bad.append(
                f"order {oid}: events applied in the order {seqs} (expected 0, 1, 2... without gaps)"
            )
        if len(set(seqs)) != len(seqs):
            bad.append(f"order {oid}: an event applied twice ({seqs})")
        keys = {key for _, key in rows}
        if keys != {oid}:
            bad.append(f"order {oid}: the listener saw sharding key(s) {sorted(map(str, keys))}")
    for oid, seq in sorted(stream.acked - applied):
        bad.append(f"order {oid}: event {seq} was acknowledged to the sender but never applied")
    for oid, seq in sorted(applied - stream.acked - stream.in_doubt):
        bad.append(f"order {oid}: event {seq} applied but never sent")
    bad.extend(
        f"order {oid}: events sent for an order that is not PAID"
        for oid in sorted({oid for oid, _ in stream.acked} - paid)
    )
    for oid, seq in sorted(set(stream.skipped)):
        if stream.attempts.get((oid, seq), 0) < 2:
            bad.append(
                f"order {oid}: event {seq} was sent once but a second copy reached the listener "
                "past the idempotent guard (applied twice but for the resend check)"
            )
    if stream.inflight_left:
        bad.append(
            f"{stream.inflight_left} in-flight journal row(s) of {GROUP} never finished (a killed "
            "consumer's message that neither the next consumer nor a sweeper handled)"
        )
    for key, messages, reason in stream.parked:
        bad.append(
            f"key {key!r} of {GROUP} is parked with {messages} message(s) ({reason}); no event is "
            "poisoned, so a failure outlived the orderly retries"
        )
    return bad
