"""Payment -> fee through the real RocketMQ client and the embedded broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from txmsg_broker.testing import wait_until

from txmsg import LocalTransactionState, TxMsgConfig
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg_samples.payment_fee.app import build, payment_service
from txmsg_samples.payment_fee.fees import Fee, FeeBase
from txmsg_samples.payment_fee.payments import TOPIC, Payment, PaymentBase, PaymentNotPending

pytest.importorskip("txmsg_rocketmq.backend")


def test_completed_payment_gets_one_fee(txmsg_broker: Any, tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "txmsg_broker",
            "topic",
            "create",
            TOPIC,
            "--namesrv",
            txmsg_broker.namesrv_addr,
            "--type",
            "TRANSACTION",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    engine = create_engine(f"sqlite:///{tmp_path / 'pay.db'}")
    PaymentBase.metadata.create_all(engine)
    FeeBase.metadata.create_all(engine)
    create_tables(engine)
    sessions = make_session_factory(engine)
    with sessions() as s, s.begin():
        s.add(Payment(id="p-1", merchant_id="m-1", amount_cents=10_000, status="PENDING"))
        s.add(Payment(id="p-2", merchant_id="m-1", amount_cents=500, status="PENDING"))
    config = TxMsgConfig(
        name_server=txmsg_broker.namesrv_addr, client_log_dir=str(tmp_path / "client")
    )
    app, _listener = build(config, sessions)
    with app:
        service = payment_service(app, sessions)
        result = service.complete("p-1")
        assert result.local_state is LocalTransactionState.COMMIT
        with pytest.raises(PaymentNotPending):
            service.complete("p-1")

        def fees() -> list[tuple[str, int]]:
            with sessions() as s:
                return [(f.payment_id, f.fee_cents) for f in s.scalars(select(Fee))]

        found = wait_until(fees, timeout=30, message="the fee consumer to book a fee")
    assert found == [("p-1", 60)]
    engine.dispose()
