"""Record-backed listener and idempotent consumer through the real RocketMQ client and the
embedded broker: commit delivered, failure never delivered, a late answer settled by the
broker's check-back from the record.  Drives the backend protocol directly so it exercises only
this layer plus the real client."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session
from txmsg_broker.testing import read_log, wait_until

from txmsg.message import Message
from txmsg.sqla import RecordBackedListener, RecordState, get_record
from txmsg.states import LocalTransactionState as S

from .business import balance, credit, ledger_rows
from .conftest import Db, make_db
from .record_rig import record_rig

backend_mod = pytest.importorskip("txmsg_rocketmq.backend")


class Pay(RecordBackedListener):
    producer_group = f"rt-sqla-{uuid.uuid4().hex[:6]}"
    answer_within = 0.2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: set once a check-back found a transaction still in flight (answered UNKNOW)
        self.in_flight_checked = threading.Event()

    def check_local(self, message: Message) -> S:
        state = super().check_local(message)
        if state is S.UNKNOW:
            self.in_flight_checked.set()
        return state

    def execute_in_transaction(self, session: Session, message: Message, arg: Any) -> None:
        if arg == "slow":
            # slower than answer_within (the send answers UNKNOW) and than the first check-back,
            # which reads IN_FLIGHT: an event, not a 1.5 s sleep that hoped the check came first
            assert self.in_flight_checked.wait(30), "no check-back while the transaction ran"
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


def test_record_backed_listener_over_the_real_client(
    txmsg_broker: Any, sqlite_db: Db, tmp_path: Path
) -> None:
    db = sqlite_db
    listener = Pay(db.sessions)
    with record_rig(backend_mod, txmsg_broker.namesrv_addr, db, listener, tmp_path) as rig:
        sent = {arg: rig.send(arg) for arg in ("ok", "fail", "slow")}
        keys = {arg: key for arg, (_mid, key) in sent.items()}
        # the slow one answered UNKNOW; the check-back reads IN_FLIGHT then COMMITTED
        wait_until(
            lambda: len(ledger_rows(db.sessions)) == 2,
            timeout=40,
            message=lambda: f"ok and slow in the ledger; rows {ledger_rows(db.sessions)}",
        )
        # once the broker has rolled "fail" back, nothing can deliver it any more
        wait_until(
            lambda: _rolled_back(txmsg_broker.log_dir, *sent["fail"]),
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
        slow_answers = rig.answers(keys["slow"])
        assert slow_answers[0] is S.UNKNOW  # in flight at the first check-back
        assert slow_answers[-1] is S.COMMIT
        assert rig.consumer.duplicates == 0
