"""RecordBackedListener on a faithful 5.x broker that checks transactions which already ended.

The embedded broker as 5.3.3 with its default ``transactionOpBatchInterval`` (3000 ms) and the fixtures'
``transactionTimeOut`` of 1000 ms: the check service sees committed and rolled-back transactions as pending
and checks them back (the real 5.3.3 did so with 2000 < 3000, docs/rocketmq-facts.md).  A listener that
answered COMMIT would deliver the rolled-back messages; ``RecordBackedListener.check_local`` reads its
record and answers ROLLBACK, so they are never delivered, and the committed ones delivered again by the
COMMIT answers are absorbed by the idempotent consumer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session
from txmsg_broker.testing import wait_until

from tests.clockwork import advance_until, stored
from txmsg.message import Message
from txmsg.sqla import RecordBackedListener, RecordState, get_record
from txmsg.states import LocalTransactionState as S

from .business import balance, credit, ledger_rows
from .conftest import Db, make_db
from .record_rig import record_rig

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
    # op batch 3000 > timeout 1000; on the manual clock (issue 36): passes and batches run when
    # the test advances it
    broker = txmsg_broker_factory(broker_version="5.3.3", check_max=5, manual_clock=True)
    listener = Pay(sqlite_db.sessions)
    with record_rig(backend_mod, broker.namesrv_addr, sqlite_db, listener, tmp_path) as rig:
        keys = {arg: rig.send(arg)[1] for arg in [f"ok{n}" for n in range(ROUNDS)]}
        keys |= {arg: rig.send(arg)[1] for arg in [f"fail{n}" for n in range(ROUNDS)]}
        ok_keys = {keys[f"ok{n}"] for n in range(ROUNDS)}
        fail_keys = {keys[f"fail{n}"] for n in range(ROUNDS)}
        # the broker checks back transactions that had ended (their op records wait in the batch)
        advance_until(
            broker, lambda: rig.checked(fail_keys), message="a rolled-back one checked back"
        )
        advance_until(broker, lambda: rig.checked(ok_keys), message="a committed one checked back")
        wait_until(
            lambda: rig.consumer.duplicates >= 1,
            timeout=30,
            message=lambda: f"a COMMIT answer redelivered; checks {rig.checks}",
        )
        # two op batches and several check passes more: nothing else may be checked or stored
        # after them, and the consumer has taken everything the topic stores
        broker.advance(6)
        wait_until(
            lambda: (
                rig.consumer.applied + rig.consumer.duplicates
                >= stored(broker.broker_addr, rig.topic)
            ),
            timeout=30,
            message="every stored message consumed",
        )
        for key in fail_keys:
            assert set(rig.answers(key)) <= {S.ROLLBACK}, (key, rig.answers(key))
        for key in ok_keys:
            assert set(rig.answers(key)) <= {S.COMMIT}, (key, rig.answers(key))
        rows = ledger_rows(sqlite_db.sessions)
        assert {k for k, _ in rows} == ok_keys  # each once, no rolled-back one
        assert len(rows) == ROUNDS
        assert balance(sqlite_db.sessions, "acct") == ROUNDS
        assert rig.consumer.duplicates >= 1
        for key, state in [(k, RecordState.COMMITTED) for k in ok_keys] + [
            (k, RecordState.ROLLED_BACK) for k in fail_keys
        ]:
            record = get_record(sqlite_db.sessions, key)
            assert record is not None
            assert record.state is state
