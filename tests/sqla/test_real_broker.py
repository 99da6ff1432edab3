"""Record-backed listener and idempotent consumer through the real RocketMQ client and the
embedded broker: commit delivered, failure never delivered, a late answer settled by the
broker's check-back from the record.  Drives the backend protocol directly so it exercises only
this layer plus the real client."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.orm import Session
from txmsg_broker.testing import read_log, wait_until

from txmsg.message import Message, OutgoingMessage
from txmsg.sqla import RecordBackedListener, RecordState, get_record, wrap_idempotent
from txmsg.states import LocalTransactionState as S

from .business import Ledger, balance, credit, ledger_rows
from .conftest import Db, make_db

backend_mod = pytest.importorskip("txmsg_rocketmq.backend")


class Pay(RecordBackedListener):
    producer_group = f"rt-sqla-{uuid.uuid4().hex[:6]}"
    answer_within = 0.2

    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
        if arg == "slow":
            time.sleep(1.5)
        credit(session, "acct", 1)
        if arg == "fail":
            raise RuntimeError("injected")


def _rolled_back(log_dir: Any, *ids: str) -> bool:
    """The broker logged a rollback (end transaction or check answer) of the message."""
    return any(
        "rollback the message" in line and any(i and i in line for i in ids)
        for line in read_log(log_dir).splitlines()
    )


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Db]:
    yield from make_db("sqlite", tmp_path)


def create_topic(namesrv: str, topic: str) -> None:
    """``txmsg topic create NAME --type TRANSACTION`` (what an operator does on RocketMQ 5)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "txmsg_broker",
            "topic",
            "create",
            topic,
            "--namesrv",
            namesrv,
            "--type",
            "TRANSACTION",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


def test_record_backed_listener_over_the_real_client(
    txmsg_broker: Any, sqlite_db: Db, tmp_path: Path
) -> None:
    db = sqlite_db
    config = SimpleNamespace(
        name_server=txmsg_broker.namesrv_addr, client_log_dir=str(tmp_path / "client-logs")
    )
    backend = backend_mod.RocketMQBackend(config)
    listener = Pay(db.sessions)
    topic = f"sqla_rt_{uuid.uuid4().hex[:8]}"
    create_topic(txmsg_broker.namesrv_addr, topic)
    checks: list[tuple[str, S]] = []
    lock = threading.Lock()

    def check(message: Message) -> S:
        state = listener.check_local(message)
        with lock:
            checks.append((message.transaction_key or "", state))
        return state

    def apply(message: Message, session: Session) -> None:
        session.add(Ledger(message_key=message.transaction_key or "", amount=1))

    consumer = wrap_idempotent(apply, db.sessions, f"cg-{listener.producer_group}", topic)

    def handle(message: Message) -> bool:
        try:
            consumer(message)
            return True
        except Exception:  # noqa: BLE001 - like a real consumer: any failure asks for redelivery
            return False

    try:
        sender = backend.create_transactional_sender(
            listener.producer_group, check, check_concurrency=2
        )
        stop = backend.subscribe(topic, f"cg-{listener.producer_group}", handle)
        keys: dict[str, str] = {}
        msg_ids: dict[str, str] = {}
        for arg in ("ok", "fail", "slow"):
            out = OutgoingMessage(topic=topic, body=arg.encode(), keys=arg)
            mid, key, status, _off = sender.send_in_transaction(
                out, lambda m, arg=arg: listener.execute_local(m, arg)
            )
            assert status == "SEND_OK"
            keys[arg], msg_ids[arg] = key, mid
        # the slow one answered UNKNOW; the check-back reads IN_FLIGHT then COMMITTED
        wait_until(
            lambda: len(ledger_rows(db.sessions)) == 2,
            timeout=40,
            message=lambda: f"ok and slow in the ledger; rows {ledger_rows(db.sessions)}",
        )
        # once the broker has rolled "fail" back, nothing can deliver it any more
        wait_until(
            lambda: _rolled_back(txmsg_broker.log_dir, msg_ids["fail"], keys["fail"]),
            timeout=30,
            message="the broker to roll back the failed transaction",
        )
        delivered = {k for k, _ in ledger_rows(db.sessions)}
        assert delivered == {keys["ok"], keys["slow"]}
        assert balance(db.sessions, "acct") == 2
        for arg, state in (
            ("ok", RecordState.COMMITTED),
            ("slow", RecordState.COMMITTED),
            ("fail", RecordState.ROLLED_BACK),
        ):
            record = get_record(db.sessions, keys[arg])
            assert record is not None, arg
            assert record.state is state, arg
        with lock:
            slow_answers = [s for k, s in checks if k == keys["slow"]]
        assert slow_answers
        assert slow_answers[-1] is S.COMMIT
        assert consumer.duplicates == 0
        stop()
    finally:
        listener.close()
        backend.close(timeout=15)
