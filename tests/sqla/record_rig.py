"""A record-backed listener wired to the real librocketmq client and a broker, without a TxMsg:
the backend protocol driven directly (transactional sender, subscription), check-backs answered
by the listener's records and recorded, deliveries applied once by an idempotent consumer.

Shared by the tests that run this layer against the embedded broker as 4.9.8 and as a faithful
5.3.3 (``test_real_broker``, ``test_faithful_5x_broker``).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy.orm import Session

from txmsg.message import Message, OutgoingMessage
from txmsg.sqla import RecordBackedListener, wrap_idempotent
from txmsg.states import LocalTransactionState as S

from .business import Ledger
from .conftest import Db


def create_topic(namesrv: str, topic: str) -> None:
    """``txmsg topic create NAME --type TRANSACTION`` (what an operator does on RocketMQ 5)."""
    subprocess.run(
        [
            *(sys.executable, "-m", "txmsg_broker", "topic", "create", topic),
            *("--namesrv", namesrv, "--type", "TRANSACTION"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


@dataclass
class Rig:
    topic: str
    sender: Any
    consumer: Any
    listener: RecordBackedListener
    #: (transaction key, the listener's answer) of every check-back, in order
    checks: list[tuple[str, S]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, arg: str) -> tuple[str, str]:
        """A transactional send whose ``execute_local`` is the listener's: (message id, key)."""
        out = OutgoingMessage(topic=self.topic, body=arg.encode(), keys=arg)
        mid, key, status, _off = self.sender.send_in_transaction(
            out, lambda m: self.listener.execute_local(m, arg)
        )
        assert status == "SEND_OK"
        return mid, key

    def checked(self, wanted: set[str]) -> bool:
        """True once a check-back reached one of the transactions ``wanted``."""
        with self.lock:
            return bool(wanted & {k for k, _ in self.checks})

    def answers(self, key: str) -> list[S]:
        with self.lock:
            return [s for k, s in self.checks if k == key]


@contextmanager
def record_rig(
    backend_mod: Any, namesrv: str, db: Db, listener: RecordBackedListener, tmp_path: Path
) -> Iterator[Rig]:
    """The rig on a fresh TRANSACTION topic; the consumer stops and everything closes after."""
    config = SimpleNamespace(name_server=namesrv, client_log_dir=str(tmp_path / "client-logs"))
    backend = backend_mod.RocketMQBackend(config)
    topic = f"{listener.producer_group.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    create_topic(namesrv, topic)
    group = f"cg-{listener.producer_group}"

    def apply(message: Message, session: Session) -> None:
        session.add(Ledger(message_key=message.transaction_key or "", amount=1))

    consumer = wrap_idempotent(apply, db.sessions, group, topic)

    def handle(message: Message) -> bool:
        try:
            consumer(message)
            return True
        except Exception:  # noqa: BLE001 - like a real consumer: any failure asks for redelivery
            return False

    try:
        rig: Rig | None = None

        def check(message: Message) -> S:
            state = listener.check_local(message)
            assert rig is not None
            with rig.lock:
                rig.checks.append((message.transaction_key or "", state))
            return state

        sender = backend.create_transactional_sender(
            listener.producer_group, check, check_concurrency=2
        )
        rig = Rig(topic=topic, sender=sender, consumer=consumer, listener=listener)
        stop = backend.subscribe(topic, group, handle)
        yield rig
        stop()
    finally:
        listener.close()
        backend.close(timeout=15)
