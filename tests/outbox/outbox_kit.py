"""What the outbox tests share: the business table they commit beside outbox rows, and readers
of the outbox table."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from txmsg_broker.testing import create_group, create_topic, unique

from txmsg import Message, Producer, TxMsgConfig
from txmsg.message import DEDUP_KEY, OutgoingMessage, SendResult
from txmsg.sqla import SessionFactory
from txmsg.sqla.outbox import OutboxMessage


class Base(DeclarativeBase):
    pass


class Order(Base):
    """A business row written in the same transaction as outbox rows."""

    __tablename__ = "outbox_test_order"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ref: Mapped[str] = mapped_column(String(64))


def outbox_rows(sessions: SessionFactory, group: str | None = None) -> list[OutboxMessage]:
    """Every row still in the outbox table, by id (detached; their attributes stay readable)."""
    with sessions() as session:
        query = select(OutboxMessage).order_by(OutboxMessage.id)
        if group is not None:
            query = query.where(OutboxMessage.outbox == group)
        found = list(session.scalars(query).all())
        session.expunge_all()
        return found


def bodies_by_seq(sessions: SessionFactory, key: str) -> list[bytes]:
    """The bodies of ``key``'s rows in ``seq`` order (the order the relay sends them)."""
    rows = [r for r in outbox_rows(sessions) if r.sharding_key == key]
    return [r.body for r in sorted(rows, key=lambda r: r.seq or 0)]


class ScriptedSender:
    """A :class:`txmsg.backend.MessageSender` of our own for the relay's database tests (the
    broker tests use the real clients): records each message handed to it, in order, and answers
    with what :attr:`fail` says (an exception to raise) or SEND_OK.  ``gate`` (when set) holds
    every send until it opens, so a test can look at the database while a relay is mid-send."""

    def __init__(self, group: str = "relay-test") -> None:
        self.group = group
        self.lock = threading.Lock()
        self.sent: list[OutgoingMessage] = []
        self.fail: Callable[[OutgoingMessage], BaseException | None] = lambda m: None
        self.gate: threading.Event | None = None
        self.waiting = 0

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.sent]

    def _answer(self, message: OutgoingMessage) -> SendResult:
        if self.gate is not None:
            with self.lock:
                self.waiting += 1
            self.gate.wait(60)
        error = self.fail(message)
        if error is not None:
            raise error
        with self.lock:
            self.sent.append(message)
            n = len(self.sent)
        return SendResult(message_id=f"id-{n}", send_status="SEND_OK", offset=n, queue_id=0)

    def send(self, message: OutgoingMessage) -> SendResult:
        return self._answer(message)

    def send_async(self, message: OutgoingMessage) -> Future[SendResult]:
        future: Future[SendResult] = Future()

        def run() -> None:
            try:
                future.set_result(self._answer(message))
            except BaseException as exc:  # noqa: BLE001 - handed to the future
                future.set_exception(exc)

        threading.Thread(target=run, daemon=True).start()
        return future

    def send_oneway(self, message: OutgoingMessage) -> None:
        self._answer(message)

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> SendResult:
        raise NotImplementedError

    def close(self, timeout: float | None = None) -> None:
        pass


def scripted_producer(sender: ScriptedSender) -> Producer:
    """A real :class:`txmsg.Producer` (its checks, conversions and statistics) over ``sender``."""
    return Producer(group=sender.group, message_sender=sender)


class Applied(Base):
    """One row per message a consumer applied, in the order applied (written with the idempotent
    consumer's dedup row: a duplicate would show as a second row)."""

    __tablename__ = "outbox_test_applied"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    topic: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(String(255))
    dedup: Mapped[str] = mapped_column(String(64))


def apply(message: Message, session: Session) -> None:
    """An idempotent listener: record the message (see :class:`Applied`)."""
    session.add(
        Applied(
            topic=message.topic,
            key=message.sharding_key or "",
            body=message.text(),
            dedup=message.properties.get(DEDUP_KEY, ""),
        )
    )


def applied(sessions: SessionFactory) -> list[tuple[str, str]]:
    """(key, body) of every applied message, in the order applied."""
    with sessions() as session:
        return [(a.key, a.body) for a in session.scalars(select(Applied).order_by(Applied.id))]


@dataclass
class Side:
    """One backend on its embedded broker: configurations, topics and groups for a test."""

    backend: str
    broker: Any
    tmp: Path

    def config(self, **extra: Any) -> TxMsgConfig:
        if self.backend == "rocketmq5":
            return TxMsgConfig(backend="rocketmq5", endpoints=self.broker.grpc_endpoint, **extra)
        return TxMsgConfig(
            backend="rocketmq",
            name_server=self.broker.namesrv_addr,
            client_log_dir=str(self.tmp / "client-logs"),
            instance_prefix=unique("ob"),
            **extra,
        )

    def settings(self) -> dict[str, str]:
        """The same configuration as ``TXMSG_*`` variables (for child processes)."""
        if self.backend == "rocketmq5":
            return {"TXMSG_BACKEND": "rocketmq5", "TXMSG_ENDPOINTS": self.broker.grpc_endpoint}
        return {
            "TXMSG_BACKEND": "rocketmq",
            "TXMSG_NAME_SERVER": self.broker.namesrv_addr,
            "TXMSG_CLIENT_LOG_DIR": str(self.tmp / "client-logs"),
        }

    def ordered_topic(self, queues: int = 4) -> str:
        """A topic for ordered messages (FIFO on RocketMQ 5)."""
        topic = unique("OutboxEvents")
        create_topic(self.broker.namesrv_addr, topic, queues=queues, message_type="FIFO")
        return topic

    def plain_topic(self) -> str:
        topic = unique("OutboxNotices")
        create_topic(self.broker.namesrv_addr, topic, message_type="NORMAL")
        return topic

    def orderly_group(self) -> str:
        """A consumer group RocketMQ 5 consumes in order (``updateSubGroup -o true``)."""
        group = unique("outbox_cg")
        create_group(self.broker.namesrv_addr, group, orderly=True)
        return group
