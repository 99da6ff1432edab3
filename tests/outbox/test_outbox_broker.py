"""Issue 25 through the real clients of both backends on the embedded broker, on SQLite and
PostgreSQL: the app's in-process relay sends committed rows (ordered ones with the key's ordered
sends), several messages to several topics in one transaction, rolled-back ones never; rows the
backend can never send are dead at once with its reason; with the broker down the commits go on,
the rows wait, and they are sent once it is back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from outbox_kit import Order, Side, applied, apply, outbox_rows
from sqlalchemy.orm import Session
from txmsg_broker.testing import unique, wait_until

from conftest import Db
from txmsg import TxMsg
from txmsg.sqla.outbox import Outbox, OutboxDeadEvent, RetryPolicy


@pytest.fixture
def apps() -> Iterator[list[TxMsg]]:
    made: list[TxMsg] = []
    yield made
    for app in made:
        app.close(timeout=20)


def service(
    side: Side,
    db: Db,
    apps: list[TxMsg],
    *,
    events: str,
    notices: str | None = None,
    config: dict[str, Any] | None = None,
    **outbox_options: Any,
) -> tuple[TxMsg, Outbox]:
    """A service app: an outbox with its relay and an orderly, idempotent consumer of
    ``events``; with ``notices``, a second app consuming that topic (idempotent); both write
    :class:`Applied` rows in the same database."""
    app = TxMsg(side.config(**(config or {})))
    apps.append(app)
    outbox = app.add_outbox(
        group=unique("outbox_pg"), session_factory=db.sessions, **outbox_options
    )
    app.add_message_listener(
        apply,
        topic=events,
        group=side.orderly_group(),
        orderly=True,
        idempotent=True,
        session_factory=db.sessions,
        orderly_retry_delay=0.2,
    )
    if notices is not None:
        # in an app of its own, started here and closed at the test's end: librocketmq 2.1.0
        # once aborted the process when one app closed its two push consumers at once
        notes = TxMsg(side.config())
        apps.append(notes)
        notes.add_message_listener(
            apply,
            topic=notices,
            group=unique("outbox_cg_n"),
            idempotent=True,
            session_factory=db.sessions,
        )
        notes.start()
    return app, outbox


def commit(db: Db, work: Callable[[Session], Any]) -> None:
    with db.sessions() as session, session.begin():
        work(session)


def test_committed_rows_arrive_each_key_in_order_rolled_back_ones_never(
    side: Side, db: Db, apps: list[TxMsg]
) -> None:
    events, notices = side.ordered_topic(), side.plain_topic()
    app, outbox = service(side, db, apps, events=events, notices=notices)
    keys = [f"order-{i}" for i in range(4)]
    with app:
        for step in range(3):
            for key in keys:

                def pay(session: Session, key: str = key, step: int = step) -> None:
                    session.add(Order(ref=f"{key}/{step}"))
                    outbox.send(session, events, f"{key}/{step}", sharding_key=key, tags="E")
                    if step == 0:  # two topics, one transaction
                        outbox.send(session, notices, f"notice/{key}", keys=key)

                commit(db, pay)

            def fail(session: Session) -> None:
                outbox.send(session, events, f"{keys[0]}/rolled-back", sharding_key=keys[0])
                outbox.send(session, notices, "notice/rolled-back")
                raise RuntimeError("the business transaction fails")

            with pytest.raises(RuntimeError, match="fails"):
                commit(db, fail)
        wait_until(
            lambda: len(applied(db.sessions)) >= 16,
            timeout=120,
            message=lambda: f"16 applied messages, got {applied(db.sessions)}",
        )
        wait_until(lambda: outbox.stats().unsent == 0, timeout=30, message="an empty outbox")
        stats = outbox.stats()
        assert stats.relay is not None
        assert (stats.dead, stats.relay.sent, stats.relay.dead) == (0, 16, 0)
    got = applied(db.sessions)
    assert len(got) == 16
    for key in keys:
        assert [body for k, body in got if k == key] == [f"{key}/{step}" for step in range(3)]
    assert sorted(body for k, body in got if body.startswith("notice/")) == sorted(
        f"notice/{key}" for key in keys
    )
    assert not [body for _, body in got if "rolled-back" in body]
    assert outbox_rows(db.sessions) == []


def test_what_the_backend_can_never_send_is_dead_at_once_and_the_rest_flows(
    side: Side, db: Db, apps: list[TxMsg]
) -> None:
    """rocketmq5: an ordered row for a NORMAL topic (the proxy needs FIFO); rocketmq: a body over
    the client's ``max_message_size``.  Either is refused by the backend before it sends."""
    events = side.ordered_topic()
    rocketmq5 = side.backend == "rocketmq5"
    target = side.plain_topic() if rocketmq5 else events
    app, outbox = service(
        side, db, apps, events=events, config={} if rocketmq5 else {"max_message_size": 1024}
    )
    dead: list[OutboxDeadEvent] = []
    app.on_outbox_dead(dead.append)
    with app:

        def write(session: Session) -> None:
            outbox.send(session, target, "x" * (10 if rocketmq5 else 2048), sharding_key="poisoned")
            outbox.send(session, events, "fine/1", sharding_key="fine")

        commit(db, write)
        wait_until(
            lambda: dead and applied(db.sessions), timeout=90, message="a dead row, a sent one"
        )
    (event,) = dead
    assert (event.permanent, event.sharding_key) == (True, "poisoned")
    # dead at the first refusal that says "never": an earlier transient failure (the 5.x client
    # had no route yet on a loaded machine) is an attempt too, so 1 or 2, never the policy's max
    assert event.attempts in (1, 2)
    assert event.error.startswith("InvalidMessageError")
    assert ("--type FIFO" if rocketmq5 else "1024") in event.error
    assert applied(db.sessions) == [("fine", "fine/1")]
    (row,) = outbox.rows(state="DEAD")
    assert row.last_error == event.error


def test_with_the_broker_down_commits_go_on_rows_wait_then_go_in_order(
    side: Side, db: Db, apps: list[TxMsg]
) -> None:
    events = side.ordered_topic()
    app, outbox = service(
        side,
        db,
        apps,
        events=events,
        retry=RetryPolicy(max_attempts=1000, first_delay=0.2, max_delay=1.0),
    )
    with app:
        commit(db, lambda s: outbox.send(s, events, "k/0", sharding_key="k"))
        wait_until(lambda: applied(db.sessions), timeout=90, message="the first message")
        side.broker.stop()
        for n in range(1, 4):  # commits need no broker
            commit(db, lambda s, n=n: outbox.send(s, events, f"k/{n}", sharding_key="k"))
        wait_until(
            lambda: any(r.attempts > 0 for r in outbox.rows()),
            timeout=60,
            message="a failed send while the broker is down",
        )
        assert outbox.stats().unsent == 3
        side.broker.start()
        wait_until(
            lambda: len(applied(db.sessions)) >= 4,
            timeout=180,
            message=lambda: f"all four applied, got {applied(db.sessions)}",
        )
        assert outbox.stats().dead == 0
    assert [body for _, body in applied(db.sessions)] == [f"k/{n}" for n in range(4)]
