"""RecordBackedListener on a faithful 5.x broker that checks transactions which already ended.

The embedded broker as 5.3.3 with its default ``transactionOpBatchInterval`` (3000 ms) and the fixtures'
``transactionTimeOut`` of 1000 ms: the check service sees committed and rolled-back transactions as pending
and checks them back (the real 5.3.3 did so with 2000 < 3000, docs/rocketmq-facts.md).  A listener that
answered COMMIT would deliver the rolled-back messages; ``RecordBackedListener.check_local`` reads its
record and answers ROLLBACK, so they are never delivered, and the committed ones delivered again by the
COMMIT answers are absorbed by the idempotent consumer.
"""

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
from txmsg_broker.testing import wait_until

from txmsg.message import Message, OutgoingMessage
from txmsg.sqla import RecordBackedListener, RecordState, get_record, wrap_idempotent
from txmsg.states import LocalTransactionState as S

from .business import Ledger, balance, credit, ledger_rows
from .conftest import Db, make_db

backend_mod = pytest.importorskip("txmsg_rocketmq.backend")

ROUNDS = 4


class Pay(RecordBackedListener):
    # no answer_within: every send's answer is final (COMMIT or ROLLBACK), so every check-back
    # below is of a transaction that had already ended
    producer_group = f"f5-sqla-{uuid.uuid4().hex[:6]}"

    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
        credit(session, "acct", 1)
        if arg.startswith("fail"):
            raise RuntimeError("injected")


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Db]:
    yield from make_db("sqlite", tmp_path)


def test_rolled_back_never_delivered_committed_absorbed(
    txmsg_broker_factory: Any, sqlite_db: Db, tmp_path: Path
) -> None:
    broker = txmsg_broker_factory(
        broker_version="5.3.3", check_max=5
    )  # op batch 3000 > timeout 1000
    db = sqlite_db
    config = SimpleNamespace(
        name_server=broker.namesrv_addr, client_log_dir=str(tmp_path / "client-logs")
    )
    backend = backend_mod.RocketMQBackend(config)
    listener = Pay(db.sessions)
    topic = f"f5_sqla_{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [
            *(sys.executable, "-m", "txmsg_broker", "topic", "create", topic),
            *("--namesrv", broker.namesrv_addr, "--type", "TRANSACTION"),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
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
        for arg in [f"ok{n}" for n in range(ROUNDS)] + [f"fail{n}" for n in range(ROUNDS)]:
            out = OutgoingMessage(topic=topic, body=arg.encode(), keys=arg)
            _mid, key, status, _off = sender.send_in_transaction(
                out, lambda m, arg=arg: listener.execute_local(m, arg)
            )
            assert status == "SEND_OK"
            keys[arg] = key
        ok_keys = {keys[f"ok{n}"] for n in range(ROUNDS)}
        fail_keys = {keys[f"fail{n}"] for n in range(ROUNDS)}

        def checked(wanted: set[str]) -> bool:
            with lock:
                return bool(wanted & {k for k, _ in checks})

        # the broker checks back transactions that had ended (their op records wait in the batch)
        wait_until(lambda: checked(fail_keys), timeout=30, message="a rolled-back one checked back")
        wait_until(lambda: checked(ok_keys), timeout=30, message="a committed one checked back")
        wait_until(
            lambda: consumer.duplicates >= 1,
            timeout=30,
            message=lambda: f"a COMMIT answer redelivered; checks {checks}",
        )
        time.sleep(6)  # two op batches and several check passes more: nothing else may arrive
        with lock:
            answers = {k: {s for kk, s in checks if kk == k} for k in ok_keys | fail_keys}
        for key in fail_keys:
            assert answers[key] <= {S.ROLLBACK}, (key, answers[key])
        for key in ok_keys:
            assert answers[key] <= {S.COMMIT}, (key, answers[key])
        assert {k for k, _ in ledger_rows(db.sessions)} == ok_keys  # each once, no rolled-back one
        assert len(ledger_rows(db.sessions)) == ROUNDS
        assert balance(db.sessions, "acct") == ROUNDS
        assert consumer.duplicates >= 1
        for key in ok_keys:
            record = get_record(db.sessions, key)
            assert record is not None
            assert record.state is RecordState.COMMITTED
        for key in fail_keys:
            record = get_record(db.sessions, key)
            assert record is not None
            assert record.state is RecordState.ROLLED_BACK
        stop()
    finally:
        listener.close()
        backend.close(timeout=15)
