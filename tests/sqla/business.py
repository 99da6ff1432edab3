"""A tiny business schema for the tests: accounts whose balance a local transaction changes."""

from __future__ import annotations

from sqlalchemy import Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from txmsg.message import UNIQ_KEY, Message


class BusinessBase(DeclarativeBase):
    pass


class Account(BusinessBase):
    __tablename__ = "test_account"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    balance: Mapped[int] = mapped_column(Integer, default=0)


class Ledger(BusinessBase):
    """Rows a consumer writes: one per applied message."""

    __tablename__ = "test_ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    message_key: Mapped[str] = mapped_column(String(128))
    amount: Mapped[int] = mapped_column(Integer)


def message(key: str, topic: str = "t-orders", **props: str) -> Message:
    return Message(topic=topic, body=b"{}", keys=f"k-{key}", properties={UNIQ_KEY: key, **props})


def credit(session: Session, name: str, amount: int) -> None:
    account = session.get(Account, name)
    if account is None:
        session.add(Account(name=name, balance=amount))
    else:
        account.balance += amount


def balance(sessions: sessionmaker[Session], name: str) -> int | None:
    with sessions() as session:
        account = session.get(Account, name)
        return None if account is None else account.balance


def ledger_rows(sessions: sessionmaker[Session]) -> list[tuple[str, int]]:
    with sessions() as session:
        return [
            (r.message_key, r.amount) for r in session.scalars(select(Ledger).order_by(Ledger.id))
        ]
