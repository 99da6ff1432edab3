"""Closing a rocketmq5 consumer is quiet: the long-polling receive it abandons ends after the 5.x
client shut down, and the client's done-callback used to hit its dropped callback executor, so
``concurrent.futures`` logged an ``AttributeError`` traceback at ERROR on every close."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from txmsg_broker.testing import create_topic, unique, wait_until

from txmsg import Message
from txmsg.sqla import create_engine, create_tables, make_session_factory


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrent", "fifo"])
def test_closing_consumers_logs_no_error(
    make_app: Any,
    txmsg_grpc_broker: Any,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    orderly: bool,
) -> None:
    topic, group = unique("rmq5_close"), unique("cg_close")
    create_topic(
        txmsg_grpc_broker.namesrv_addr, topic, message_type="FIFO" if orderly else "NORMAL"
    )
    if orderly:
        from txmsg_broker.testing import create_group  # noqa: PLC0415

        create_group(txmsg_grpc_broker.namesrv_addr, group, orderly=True)
    got: list[str] = []

    def handle(message: Message) -> None:
        got.append(message.text())

    app = make_app()
    app.add_producer(group=unique("pg_close"))
    options: dict[str, Any] = {}
    if orderly:  # parking needs the service's database
        engine = create_engine(f"sqlite:///{tmp_path / 'parking.db'}")
        create_tables(engine)
        options["session_factory"] = make_session_factory(engine)
    app.add_message_listener(handle, topic=topic, group=group, orderly=orderly, **options)
    caplog.set_level(logging.DEBUG)
    with app:
        producer = app.producer()
        if orderly:
            producer.send_orderly(topic, "one", sharding_key="k")
        else:
            producer.send(topic, "one")
        wait_until(lambda: got == ["one"], timeout=60)
        time.sleep(0.5)  # the loop is back in a long-polling receive, the one close abandons
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
