"""The four service databases of a chaos run, and the producer's payment-attempt journal.

SQLite files by default; with ``--database-url postgresql://...`` each service gets its own schema
(``chaos_orders`` ...) on that server, dropped and recreated at the start of a run.  The journal
(:class:`PaymentAttempt`) is the producer-side record the seed's equations need: a row is written
*before* ``pay`` and its outcome *after*, so a row without an outcome is a payment whose producer
died mid-transaction - the run's "in doubt" set, read from the database like everything else.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import DateTime, Engine, Integer, String, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from txmsg_samples.order import cart, logistics, points
from txmsg_samples.order.orders import OrderBase

from benchmarks.chaos.outbox_stream import BankBase, LedgerBase
from benchmarks.chaos.settings import SERVICES
from benchmarks.chaos.tracking import SendJournalBase, TrackingBase
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.models import utcnow


class JournalBase(DeclarativeBase):
    pass


class PaymentAttempt(JournalBase):
    """One ``OrderService.pay`` call as the producer saw it (lives in the orders database)."""

    __tablename__ = "chaos_payment_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(64), index=True)
    producer: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str | None] = mapped_column(String(16), default=None)
    """COMMIT / ROLLBACK / UNKNOW as ``pay`` returned it, ERROR if it raised, NULL if the process
    died before it returned."""
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    """When ``pay`` returned (the network-fault figures' latency = finished_at - started_at)."""


def start_attempt(sessions: sessionmaker[Session], order_id: str, producer: str) -> int:
    with sessions() as session, session.begin():
        row = PaymentAttempt(order_id=order_id, producer=producer, started_at=utcnow())
        session.add(row)
        session.flush()
        return int(row.id)


def finish_attempt(sessions: sessionmaker[Session], attempt_id: int, outcome: str) -> None:
    with sessions() as session, session.begin():
        session.execute(
            update(PaymentAttempt)
            .where(PaymentAttempt.id == attempt_id)
            .values(outcome=outcome, finished_at=utcnow())
        )


def attempts(sessions: sessionmaker[Session]) -> list[tuple[str, str | None]]:
    with sessions() as session:
        return [(a.order_id, a.outcome) for a in session.scalars(select(PaymentAttempt))]


BASES = {
    "orders": (OrderBase, JournalBase, SendJournalBase),
    "points": (points.PointsBase,),
    "logistics": (logistics.LogisticsBase,),
    "cart": (cart.CartBase,),
    "tracking": (TrackingBase,),
    "bank": (BankBase,),
    "ledger": (LedgerBase,),
}


def prepare(workdir: Path, database_url: str | None) -> dict[str, str]:
    """Create empty service databases; returns service -> URL for :class:`ChaosSettings`."""
    urls: dict[str, str] = {}
    if not database_url:
        db = workdir / "db"
        db.mkdir(parents=True, exist_ok=True)
        for service in SERVICES:
            (db / f"{service}.db").unlink(missing_ok=True)
            urls[service] = f"sqlite:///{db / service}.db"
    else:
        admin = create_engine(database_url)
        with admin.begin() as conn:
            for service in SERVICES:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "chaos_{service}" CASCADE'))
                conn.execute(text(f'CREATE SCHEMA "chaos_{service}"'))
        admin.dispose()
        base = make_url(database_url)
        for service in SERVICES:
            option = quote(f"-csearch_path=chaos_{service}")
            separator = "&" if base.query else "?"
            urls[service] = f"{database_url}{separator}options={option}"
    for service, url in urls.items():
        engine = create_engine(url)
        for declarative in BASES[service]:
            declarative.metadata.create_all(engine)
        create_tables(engine)
        engine.dispose()
    return urls


def open_all(urls: dict[str, str]) -> dict[str, sessionmaker[Session]]:
    """Session factories for the checker (small pools: it only reads)."""
    return {service: make_session_factory(_engine(url)) for service, url in urls.items()}


def close_all(dbs: dict[str, sessionmaker[Session]]) -> None:
    """Dispose the engines behind :func:`open_all`'s session factories."""
    for factory in dbs.values():
        bind = factory.kw.get("bind")
        if isinstance(bind, Engine):
            bind.dispose()


def _engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return create_engine(url)
    return create_engine(url, pool_size=2, max_overflow=2)
