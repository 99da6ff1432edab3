"""The chaos run's outbox stream (issue 25): transfers committed with their messages through the
transactional outbox, sent by relays that the monkey kills, applied by orderly idempotent
consumers.

Why it is in the chaos run: the outbox promises that a message exists exactly when its
transaction committed, that a key's messages reach the consumer in commit order, and that a relay
killed anywhere loses nothing (at least once, absorbed by idempotent consumers).  Each of these
breaks exactly where the monkey strikes: a writer killed inside its transaction, a relay killed
between the broker's answer and the row's deletion, a broker restarted under a relay, a consumer
killed after applying a message.

* **Writers** (``bank`` service, ``roles outbox-writer``): each transaction moves an amount from
  one account to another: it bumps both accounts' ``version`` (rows locked in key order), records
  a :class:`Transfer` and writes three outbox messages, sharding key = account: the debit (part 0)
  and a notice (part 1) for the source, the credit (part 0) for the destination.  Some
  transactions are rolled back after writing everything (decided from the transfer id, so the
  check knows which); every attempt is journaled first (:class:`TransferAttempt`), in a
  transaction of its own.  Writer 0 runs the relay in its process (the app's default), the others
  write only (``relay=False``).
* **Relays**: the in-process one, and ``txmsg outbox relay --app
  benchmarks.chaos.outbox_stream:relay_app`` processes.  On SQLite one holds the lease and the
  others stand by; on PostgreSQL they share the rows (``FOR UPDATE SKIP LOCKED``).
* **Consumers** (``ledger`` service): ``orderly=True, idempotent=True``; applying a message adds a
  :class:`LedgerEntry` (its id is the order of application) and adds the delta to the account's
  :class:`LedgerBalance`.

The check (:func:`verify`, from the bank and ledger databases alone): per account, the entries
applied are exactly the committed transfers' messages in commit order - versions ``1, 2, ...``
without a gap, parts in order, each once; no entry of a transfer that did not commit; balances
equal the committed transfers' sum; the outbox is empty (nothing unsent, nothing dead); no key
parked, nothing left in the in-flight journal.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy import DateTime, Integer, String, func, select, update
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from txmsg import TxMsg
from txmsg.message import Message
from txmsg.sqla import create_engine, duplicates_absorbed, make_session_factory, parked_keys
from txmsg.sqla.models import OrderlyInflight, utcnow
from txmsg.sqla.outbox import Outbox, RetryPolicy, backlogs

log = logging.getLogger("txmsg.chaos")

TOPIC = "ledger-events"
"""The outbox stream's topic (FIFO: on RocketMQ 5 the sharding key is the message group)."""
GROUP = "ledger-service"
OUTBOX_GROUP = "bank-outbox"
ACCOUNTS = 12
"""Sharding keys: few enough that every key gets many transfers (order matters per key)."""
ROLLBACK_RATE = 0.15
"""Transfers whose transaction raises after writing its rows and messages (rolled back)."""
SETTINGS_ENV = "TXMSG_CHAOS_SETTINGS"
"""The relay process's ``--app`` factory reads the run's settings file from this variable."""
RETRY = RetryPolicy(max_attempts=1000, first_delay=0.1, max_delay=1.0)
"""Sends retried for as long as any outage of the run lasts: a dead row is a violation."""
POLL = 0.2
"""The relays' poll interval: a standby takes over from a killed holder this quickly."""


def account(n: int) -> str:
    return f"acct-{n:02d}"


# ---- the bank's tables (the outbox writer's database) ----------------------------------------------
class BankBase(DeclarativeBase):
    pass


class Account(BankBase):
    """An account; ``version`` counts its committed transfers (its messages' commit order)."""

    __tablename__ = "bank_accounts"

    key: Mapped[str] = mapped_column(String(32), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)


class Transfer(BankBase):
    """A committed transfer: it exists exactly when its transaction (and its messages) did."""

    __tablename__ = "bank_transfers"

    tx_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    src: Mapped[str] = mapped_column(String(32))
    dst: Mapped[str] = mapped_column(String(32))
    amount: Mapped[int] = mapped_column(Integer)
    src_version: Mapped[int] = mapped_column(Integer)
    dst_version: Mapped[int] = mapped_column(Integer)
    writer: Mapped[str] = mapped_column(String(64))


class TransferAttempt(BankBase):
    """A transfer a writer started (journaled before its transaction, in one of its own)."""

    __tablename__ = "bank_transfer_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str] = mapped_column(String(64), index=True)
    writer: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


# ---- the ledger's tables (the consumers' database) -------------------------------------------------
class LedgerBase(DeclarativeBase):
    pass


class LedgerEntry(LedgerBase):
    """A message the ledger applied; ``id`` orders the applications."""

    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tx_id: Mapped[str] = mapped_column(String(64), index=True)
    key: Mapped[str] = mapped_column(String(32), index=True)
    version: Mapped[int] = mapped_column(Integer)
    part: Mapped[int] = mapped_column(Integer)
    delta: Mapped[int] = mapped_column(Integer)
    sharding_key: Mapped[str | None] = mapped_column(String(64))
    message_id: Mapped[str | None] = mapped_column(String(128))


class LedgerBalance(LedgerBase):
    """An account's balance as the ledger sees it (the effect a duplicate would double)."""

    __tablename__ = "ledger_balances"

    key: Mapped[str] = mapped_column(String(32), primary_key=True)
    amount: Mapped[int] = mapped_column(Integer, default=0)


def seed(bank: sessionmaker[Session], ledger: sessionmaker[Session]) -> None:
    """The accounts, at version 0 and balance 0."""
    with bank() as session, session.begin():
        session.add_all(Account(key=account(n), version=0) for n in range(ACCOUNTS))
    with ledger() as session, session.begin():
        session.add_all(LedgerBalance(key=account(n), amount=0) for n in range(ACCOUNTS))


def planned_rollback(seed_value: int, tx_id: str) -> bool:
    """Whether transfer ``tx_id`` rolls back: a pure function of the seed and the id."""
    return random.Random(f"{seed_value}:outbox:{tx_id}").random() < ROLLBACK_RATE


class InjectedRollback(RuntimeError):
    """The transfer's planned failure, raised after every row and message was written."""


# ---- writer --------------------------------------------------------------------------------------
def declare_outbox(app: TxMsg, sessions: sessionmaker[Session], *, relay: bool) -> Outbox:
    return app.add_outbox(
        group=OUTBOX_GROUP, session_factory=sessions, relay=relay, retry=RETRY, poll_interval=POLL
    )


def transfer(
    sessions: sessionmaker[Session],
    outbox: Outbox,
    rng: random.Random,
    tx_id: str,
    writer: str,
    seed_value: int,
) -> bool:
    """One transfer transaction (journaled first); True when it committed.

    Raises:
        InjectedRollback: the planned failure (the transaction rolled back).
    """
    with sessions() as session, session.begin():
        session.add(TransferAttempt(tx_id=tx_id, writer=writer, started_at=utcnow()))
    src, dst = (account(n) for n in rng.sample(range(ACCOUNTS), 2))
    amount = rng.randint(1, 1000)
    with sessions() as session, session.begin():
        rows = {
            a.key: a
            for a in session.scalars(
                select(Account)
                .where(Account.key.in_([src, dst]))
                .order_by(Account.key)
                .with_for_update()
            )
        }
        for row in rows.values():
            row.version += 1
        session.add(
            Transfer(
                tx_id=tx_id,
                src=src,
                dst=dst,
                amount=amount,
                src_version=rows[src].version,
                dst_version=rows[dst].version,
                writer=writer,
            )
        )
        messages = {
            src: [(0, -amount), (1, 0)],  # the debit, then a notice: two messages of one key
            dst: [(0, amount)],
        }
        for key in sorted(messages):  # key lock rows in one order, as the account rows
            for part, delta in messages[key]:
                body = {
                    "tx": tx_id,
                    "key": key,
                    "version": rows[key].version,
                    "part": part,
                    "delta": delta,
                }
                outbox.send(session, TOPIC, body, sharding_key=key, keys=f"{tx_id}:{key}:{part}")
        if planned_rollback(seed_value, tx_id):
            session.flush()  # the rows really were written; the rollback must undo them
            raise InjectedRollback(f"planned rollback of {tx_id}")
    return True


class Writer:
    """One bank-service instance: transfers from a few threads until told to stop."""

    def __init__(self, app: TxMsg, sessions: sessionmaker[Session], outbox: Outbox) -> None:
        self.app = app
        self.sessions = sessions
        self.outbox = outbox

    def run_thread(
        self, name: str, thread: int, seed_value: int, interval: float, going: threading.Event
    ) -> None:
        rng = random.Random(f"{seed_value}:{name}:{os.getpid()}:{thread}")
        seq = 0
        while going.is_set():
            tx_id = f"{name}-{os.getpid()}-{thread}-{seq:05d}"
            seq += 1
            try:
                transfer(self.sessions, self.outbox, rng, tx_id, name, seed_value)
            except InjectedRollback:
                pass
            except Exception as exc:  # noqa: BLE001 - database busy or gone: the next one tries
                log.warning("%s: transfer %s failed: %s", name, tx_id, exc)
                time.sleep(0.5)
            time.sleep(interval)


# ---- the relay process ---------------------------------------------------------------------------
def relay_app() -> TxMsg:
    """``txmsg outbox relay --app benchmarks.chaos.outbox_stream:relay_app``: the bank's app as
    the relay process loads it (settings from :data:`SETTINGS_ENV`)."""
    from benchmarks.chaos.roles import _client_config  # noqa: PLC0415 - avoids an import cycle
    from benchmarks.chaos.settings import ChaosSettings  # noqa: PLC0415

    settings = ChaosSettings.load(os.environ[SETTINGS_ENV])
    app = TxMsg(_client_config(settings, f"relay-{os.getpid()}", {}))
    engine = create_engine(settings.database_urls["bank"])
    declare_outbox(app, make_session_factory(engine), relay=False)
    return app


# ---- listener ------------------------------------------------------------------------------------
def on_ledger_event(message: Message, session: Session) -> None:
    """The ledger's orderly, idempotent listener (runs in the idempotent transaction)."""
    data = json.loads(message.body)
    key, delta = str(data["key"]), int(data["delta"])
    session.add(
        LedgerEntry(
            tx_id=str(data["tx"]),
            key=key,
            version=int(data["version"]),
            part=int(data["part"]),
            delta=delta,
            sharding_key=message.sharding_key,
            message_id=message.message_id,
        )
    )
    session.execute(
        update(LedgerBalance)
        .where(LedgerBalance.key == key)
        .values(amount=LedgerBalance.amount + delta)
    )


# ---- check ---------------------------------------------------------------------------------------
Expected = tuple[int, int, str, int]
"""(version, part, transfer id, delta) of one message."""


@dataclass
class OutboxSnapshot:
    """What the bank and ledger databases say about the outbox stream."""

    attempted: set[str] = field(default_factory=set)
    committed: dict[str, Transfer] = field(default_factory=dict)
    applied: dict[str, list[tuple[int, int, str, int, str | None]]] = field(default_factory=dict)
    """account -> (version, part, transfer id, delta, sharding key seen) in application order."""
    balances: dict[str, int] = field(default_factory=dict)
    unsent: int = 0
    dead: int = 0
    inflight_left: int = 0
    duplicates: int = 0
    parked: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def expected(self) -> dict[str, list[Expected]]:
        """account -> the committed transfers' messages in commit order."""
        out: dict[str, list[Expected]] = defaultdict(list)
        for t in self.committed.values():
            out[t.src] += [(t.src_version, 0, t.tx_id, -t.amount), (t.src_version, 1, t.tx_id, 0)]
            out[t.dst].append((t.dst_version, 0, t.tx_id, t.amount))
        return {key: sorted(rows) for key, rows in out.items()}

    @property
    def messages(self) -> int:
        return 3 * len(self.committed)

    @property
    def applied_count(self) -> int:
        return sum(len(rows) for rows in self.applied.values())

    @property
    def rolled_back(self) -> int:
        return len(self.attempted - set(self.committed))

    @property
    def caught_up(self) -> bool:
        return self.unsent == 0 and self.inflight_left == 0 and self.applied_count >= self.messages


def read(bank: sessionmaker[Session], ledger: sessionmaker[Session]) -> OutboxSnapshot:
    snap = OutboxSnapshot()
    with bank() as session:
        snap.attempted = set(session.scalars(select(TransferAttempt.tx_id)))
        snap.committed = {t.tx_id: t for t in session.scalars(select(Transfer))}
        session.expunge_all()
    (backlog,) = backlogs(bank, OUTBOX_GROUP)
    snap.unsent, snap.dead = backlog.unsent, backlog.dead
    with ledger() as session:
        for key, version, part, tx_id, delta, seen in session.execute(
            select(
                LedgerEntry.key,
                LedgerEntry.version,
                LedgerEntry.part,
                LedgerEntry.tx_id,
                LedgerEntry.delta,
                LedgerEntry.sharding_key,
            ).order_by(LedgerEntry.id)
        ):
            snap.applied.setdefault(key, []).append((version, part, tx_id, delta, seen))
        snap.balances = {b.key: b.amount for b in session.scalars(select(LedgerBalance))}
        snap.inflight_left = (
            session.scalar(
                select(func.count())
                .select_from(OrderlyInflight)
                .where(OrderlyInflight.consumer_group == GROUP)
            )
            or 0
        )
    snap.duplicates = duplicates_absorbed(ledger, GROUP)
    snap.parked = [(v.sharding_key, v.messages, v.reason) for v in parked_keys(ledger, GROUP)]
    return snap


def verify(snap: OutboxSnapshot) -> list[str]:
    """The outbox stream's invariants; one line per violation."""
    bad: list[str] = []
    expected = snap.expected
    committed = snap.committed
    for key in sorted(set(expected) | set(snap.applied)):
        want = expected.get(key, [])
        rows = snap.applied.get(key, [])
        got = [(v, p, tx, d) for v, p, tx, d, _ in rows]
        for v, p, tx, _, _ in rows:
            if tx not in committed:
                what = "rolled back" if tx in snap.attempted else "never started"
                bad.append(
                    f"account {key}: message {tx} v{v}.{p} applied, but that transfer {what} "
                    "(a message of a transaction that did not commit)"
                )
        counts = Counter(got)
        for item, n in sorted(counts.items()):
            if n > 1:
                bad.append(
                    f"account {key}: message {item[2]} v{item[0]}.{item[1]} applied {n} times"
                )
        bad.extend(
            f"account {key}: committed message {item[2]} v{item[0]}.{item[1]} never applied (lost)"
            for item in sorted(set(want) - set(got))
        )
        applied_order = [(v, p) for v, p, *_ in got]
        if applied_order != sorted(applied_order):
            bad.append(
                f"account {key}: messages applied out of commit order: "
                f"{' '.join(f'v{v}.{p}' for v, p in applied_order[:40])}"
            )
        versions = sorted({v for v, _, _, _ in want})
        if versions != list(range(1, len(versions) + 1)):
            bad.append(f"account {key}: committed versions {versions[:20]} have gaps")
        seen = {s for *_, s in rows}
        if seen - {key}:
            bad.append(f"account {key}: the listener saw sharding key(s) {sorted(map(str, seen))}")
        balance = sum(d for _, _, _, d in want)
        if snap.balances.get(key, 0) != balance:
            bad.append(
                f"account {key}: ledger balance {snap.balances.get(key, 0)}, committed transfers "
                f"sum to {balance} (an effect applied twice or lost)"
            )
    if snap.unsent:
        bad.append(f"{snap.unsent} outbox row(s) still unsent after the run settled")
    if snap.dead:
        bad.append(f"{snap.dead} outbox row(s) dead (a send failed for good)")
    if snap.inflight_left:
        bad.append(f"{snap.inflight_left} in-flight journal row(s) of {GROUP} never finished")
    for key, messages, reason in snap.parked:
        bad.append(f"key {key!r} of {GROUP} is parked with {messages} message(s) ({reason})")
    return bad


def relay_takeovers(logs: Path) -> int:
    """SQLite lease takeovers the relays logged (a standby relay replacing a killed holder)."""
    count = 0
    for path in sorted(logs.glob("*.log")):
        with path.open("rb") as fh:
            count += sum(1 for line in fh if b"took over from" in line)
    return count
