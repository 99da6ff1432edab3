"""Payment -> fee sample without a broker: local transaction, record check, idempotent fee."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from txmsg.message import UNIQ_KEY, Message
from txmsg.sqla import create_engine, create_tables, make_session_factory, wrap_idempotent
from txmsg.states import LocalTransactionState as S
from txmsg_samples.payment_fee.fees import GROUP as FEE_GROUP
from txmsg_samples.payment_fee.fees import Fee, FeeBase, fee_for, on_payment_completed
from txmsg_samples.payment_fee.payments import (
    TOPIC,
    Payment,
    PaymentBase,
    PaymentListener,
    event_body,
)


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = create_engine(f"sqlite:///{tmp_path / 'pay.db'}")
    PaymentBase.metadata.create_all(engine)
    FeeBase.metadata.create_all(engine)
    create_tables(engine)
    yield make_session_factory(engine)
    engine.dispose()


@pytest.mark.parametrize(
    ("amount", "fee"),
    [(0, 5), (100, 5), (10_000, 60), (12_345, 74), (99_999_99, 60_000), (12_417, 75)],
)
def test_fee_for(amount: int, fee: int) -> None:
    assert fee_for(amount) == fee


def test_fee_rejects_negative() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        fee_for(-1)


def test_complete_then_fee_once(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        s.add(Payment(id="p1", merchant_id="m1", amount_cents=25_000, status="PENDING"))
    listener = PaymentListener(sessions)
    with sessions() as s:
        payment = s.get(Payment, "p1")
        assert payment is not None
        body = event_body(payment)
    msg = Message(topic=TOPIC, body=body, properties={UNIQ_KEY: "pay-1"})
    assert listener.execute_local(msg, "p1") is S.COMMIT
    assert listener.check_local(msg) is S.COMMIT
    # paying again fails in the local transaction and answers ROLLBACK
    again = Message(topic=TOPIC, body=body, properties={UNIQ_KEY: "pay-2"})
    assert listener.execute_local(again, "p1") is S.ROLLBACK
    assert listener.check_local(again) is S.ROLLBACK

    consumer = wrap_idempotent(on_payment_completed, sessions, FEE_GROUP, TOPIC)
    consumer(msg)
    consumer(msg)
    with sessions() as s:
        fees = {(f.payment_id, f.fee_cents) for f in s.query(Fee)}
    assert fees == {("p1", 150)}
    assert consumer.duplicates == 1
