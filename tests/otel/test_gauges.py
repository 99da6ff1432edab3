"""Observed instruments read the same figures as ``stats()``: the outbox backlog (the executor
gauges and parked keys are checked through the broker, test_broker_*)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from txmsg_broker.testing import unique, wait_until

from txmsg.message import SendResult
from txmsg.otel import names
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.outbox import Outbox

from .conftest import Telemetry


class Unanswered:
    """An outbox sender whose sends never get an answer: the rows stay unsent."""

    def __init__(self) -> None:
        self.futures: list[Future[SendResult]] = []

    def send_async(self, *args: Any, **options: Any) -> Future[SendResult]:
        future: Future[SendResult] = Future()
        self.futures.append(future)
        return future

    send_orderly_async = send_async


def test_the_outbox_gauges_equal_its_stats(telemetry: Telemetry, tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'outbox.db'}")
    create_tables(engine)
    sessions = make_session_factory(engine)
    group = unique("pg_ob")
    outbox = Outbox(group=group, session_factory=sessions, send_timeout=0.5, poll_interval=0.1)
    try:
        with sessions() as session, session.begin():
            for n in range(3):
                outbox.send(session, "orders", {"n": n}, sharding_key=f"k{n}")
        assert telemetry.points(names.OUTBOX_UNSENT, txmsg__producer__group=group) == []
        sender = Unanswered()
        outbox.start_relay(sender)  # type: ignore[arg-type]
        wait_until(lambda: len(sender.futures) >= 3, timeout=30)
        stats = outbox.stats()
        unsent = telemetry.total(names.OUTBOX_UNSENT, txmsg__producer__group=group)
        assert unsent == stats.unsent == 3
        (age,) = telemetry.points(names.OUTBOX_OLDEST_AGE, txmsg__producer__group=group)
        assert stats.oldest_unsent_age is not None
        assert 0 < age.value <= outbox.stats().oldest_unsent_age
        outbox.stop_relay(timeout=5)
        assert telemetry.points(names.OUTBOX_UNSENT, txmsg__producer__group=group) == []
    finally:
        outbox.stop_relay(timeout=5)
        engine.dispose()
