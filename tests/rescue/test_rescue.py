"""The rescue of discarded half messages (issue 39, :mod:`txmsg.rescue`), on both backends.

A producer group whose check-backs go unanswered (its ``check_local`` answers UNKNOW: the service
is "down") past ``transactionCheckMax`` has its half messages discarded by the broker into
``TRANS_CHECK_MAX_TIME_TOPIC``.  An app of that group whose ``check_local`` can answer again
sends the committed ones to their topic, once, with their keys, tags, properties and dedup key;
leaves the rolled-back ones; gives up on the ones that stay UNKNOW (a dead row, the hook, the
metric).  Everything runs on the broker's manual clock: the tests wait for events, never for the
broker's timings.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import pytest

from txmsg import LocalTransactionState, Message, TxMsg
from txmsg.message import DEDUP_KEY, UNIQ_KEY
from txmsg.rescue import RESCUED_PROPERTY, DiscardedEvent, Rescuer

from .conftest import Ledger, discard_pending, listener_class, transaction_topic

pytestmark = pytest.mark.txmsg_manual_clock

GROUP = "rescue-tx"


def down_service(make_app: Callable[..., TxMsg], ledger: Ledger, topic: str) -> TxMsg:
    """The service during its outage: it sends, its check_local cannot answer, and it has no
    rescue of its own (the rescue is what comes back with the fixed service)."""
    app = make_app()
    app.add_transactional_listener(
        listener_class(ledger), group=GROUP, topics=[topic], rescue_discarded=False
    )
    return app


def advance_until(broker: Any, done: Callable[[], bool], *, step: int = 60) -> None:
    """Advance the broker's clock one check interval at a time until ``done()`` (each step
    returns once its check-backs were answered; the rescue consumer then gets a moment)."""
    for _ in range(20):
        if done():
            return
        assert broker.advance(step).unanswered == ()
        for _ in range(20):  # up to 2 s of wall time for the consumer to take a new discard
            if done():
                return
            threading.Event().wait(0.1)
    raise AssertionError("the broker's clock advanced 20 intervals without the expected event")


def wait_rescuer(rescuer: Rescuer, predicate: Callable[[Any], bool]) -> None:
    assert rescuer.wait_for(predicate, timeout=60), rescuer.stats()


def test_a_committed_discard_is_sent_once_and_a_rolled_back_one_never(
    make_app: Callable[..., TxMsg], broker: Any
) -> None:
    topic = transaction_topic(broker, "rescue-orders")
    ledger = Ledger()
    down = down_service(make_app, ledger, topic)
    with down:
        producer = down.transactional_producer(GROUP)
        paid = producer.send_in_transaction(
            topic,
            {"order": 1},
            arg="commit",
            keys=["order-1", "customer-7"],
            tags="paid",
            properties={"tenant": "acme"},
        )
        cancelled = producer.send_in_transaction(topic, {"order": 2}, arg="rollback", tags="paid")
        assert paid.local_state is LocalTransactionState.UNKNOW
        discard_pending(broker)
        assert ledger.checked.count(paid.transaction_key) == 3  # CHECK_MAX, all unanswered
    ledger.down = False  # the fixed service is back

    received: queue.Queue[Message] = queue.Queue()
    app = make_app()
    app.add_transactional_listener(listener_class(ledger), group=GROUP, topics=[topic])
    app.add_message_listener(received.put, topic=topic, group="rescue-points")
    with app:
        rescuer = app.rescuers[GROUP]
        wait_rescuer(rescuer, lambda s: s.rescued == 1 and s.rolled_back == 1)
        message = received.get(timeout=30)
        assert message.json() == {"order": 1}
        assert message.tags == "paid"
        assert sorted((message.keys or "").split()) == ["customer-7", "order-1"]
        assert message.properties["tenant"] == "acme"
        assert message.properties[DEDUP_KEY] == paid.transaction_key
        assert message.properties[RESCUED_PROPERTY] == paid.transaction_key
        # the discard's own bookkeeping stays behind (the new transaction has its own TRAN_MSG)
        for internal in ("TRANSACTION_CHECK_TIMES", "REAL_QID", "TRAN_PREPARED_QUEUE_OFFSET"):
            assert internal not in message.properties
        # nothing more: the retry delays of an hour pass, the rolled-back order never comes
        broker.advance(3600)
        with pytest.raises(queue.Empty):
            received.get(timeout=0.5)
        stats = rescuer.stats()
        assert (stats.rescued, stats.rolled_back, stats.retried, stats.dead) == (1, 1, 0, 0)
        assert cancelled.transaction_key in ledger.checked


@pytest.mark.parametrize("failing", ["unknown", "raises"])
def test_unknown_forever_ends_in_a_dead_row_the_hook_and_the_metric(
    make_app: Callable[..., TxMsg], broker: Any, tmp_path: Any, failing: str
) -> None:
    """``check_local`` that answers UNKNOW, or raises (the same to the rescuer: no answer)."""
    import txmsg.sqla as sqla  # noqa: PLC0415 - only this test needs SQLAlchemy
    from txmsg.otel._runtime import otel  # noqa: PLC0415
    from txmsg.sqla.discarded import dead_rows  # noqa: PLC0415

    topic = transaction_topic(broker, "rescue-lost")
    ledger = Ledger()
    down = down_service(make_app, ledger, topic)
    with down:
        lost = down.transactional_producer(GROUP).send_in_transaction(
            topic, {"order": 3}, arg="commit", keys="order-3"
        )
        discard_pending(broker)

    ledger.raises = failing == "raises"
    engine = sqla.create_engine(f"sqlite:///{tmp_path / 'service.db'}")
    sqla.create_tables(engine)
    sessions = sqla.make_session_factory(engine)
    base = listener_class(ledger)  # still down: check_local keeps answering UNKNOW

    class RecordListener(base):  # type: ignore[misc, valid-type]
        session_factory = sessions  # where a record-backed listener keeps its records

    events: list[DiscardedEvent] = []
    app = make_app()
    app.add_transactional_listener(RecordListener, group=GROUP, topics=[topic], rescue_attempts=2)
    app.on_transaction_discarded(events.append)
    with app:
        rescuer = app.rescuers[GROUP]
        wait_rescuer(rescuer, lambda s: s.retried == 1)  # round 1: back into the check cycle
        discard_pending(broker)  # still UNKNOW at every check-back: discarded again
        wait_rescuer(rescuer, lambda s: s.dead == 1)  # round 2 of 2: given up
        assert [e.transaction_key for e in events] == [lost.transaction_key]
        assert events[0].stored is True
        assert events[0].topic == topic
        assert events[0].attempts == 2
        rows = dead_rows(sessions, GROUP)
        assert [r.transaction_key for r in rows] == [lost.transaction_key]
        assert rows[0].message.json() == {"order": 3}
        assert rows[0].message.keys == "order-3"
        assert rescuer.stats().rescued == 0
    o = otel()
    if o is not None:  # opentelemetry-api is a dev dependency: the counter saw the outcomes
        counts = {key: total for key, (total, _attributes) in o.discards._counts.items()}
        assert counts[(GROUP, "dead")] >= 1
        assert counts[(GROUP, "retried")] >= 1
    engine.dispose()


def test_two_instances_rescue_a_discard_once(make_app: Callable[..., TxMsg], broker: Any) -> None:
    topic = transaction_topic(broker, "rescue-twice")
    warm = Ledger()  # another group's discard: the discard topic exists before the instances start
    with down_service(make_app, warm, "rescue-warm") as other:
        transaction_topic(broker, "rescue-warm")
        other.transactional_producer(GROUP).send_in_transaction(
            "rescue-warm", {"warm": 1}, arg="rollback"
        )
        discard_pending(broker)

    ledger = Ledger()  # down while the broker checks: both instances answer UNKNOW
    received: queue.Queue[Message] = queue.Queue()
    instances = []
    for _ in range(2):
        app = make_app()
        app.add_transactional_listener(listener_class(ledger), group=f"{GROUP}-2", topics=[topic])
        instances.append(app)
    instances[0].add_message_listener(received.put, topic=topic, group="rescue-twice-points")
    for app in instances:
        app.start()
    sent = (
        instances[0]
        .transactional_producer(f"{GROUP}-2")
        .send_in_transaction(topic, {"order": 4}, arg="commit")
    )
    rescuers = [app.rescuers[f"{GROUP}-2"] for app in instances]
    # check interval by check interval until the discard: the one instance that owns the
    # discard queue asks, gets UNKNOW (still down), and puts it back into the check cycle
    advance_until(broker, lambda: sum(r.stats().retried for r in rescuers) >= 1)
    assert sum(r.stats().retried for r in rescuers) == 1
    ledger.down = False
    broker.advance(60)  # put back into the check cycle: the next check-back commits it
    message = received.get(timeout=30)
    assert message.properties[DEDUP_KEY] == sent.transaction_key
    broker.advance(3600)
    with pytest.raises(queue.Empty):
        received.get(timeout=0.5)
    assert sum(r.stats().rescued for r in rescuers) == 0  # the check-back committed it
    assert message.transaction_key == sent.transaction_key


def test_off_means_nothing_consumes_the_discard_topic(
    make_app: Callable[..., TxMsg], broker: Any
) -> None:
    topic = transaction_topic(broker, "rescue-off")
    ledger = Ledger()
    with down_service(make_app, ledger, topic) as down:
        down.transactional_producer(GROUP).send_in_transaction(topic, {"order": 5}, arg="commit")
        discard_pending(broker)
    ledger.down = False  # a rescuer would now send it

    received: queue.Queue[Message] = queue.Queue()
    app = make_app()
    app.add_transactional_listener(
        listener_class(ledger), group=GROUP, topics=[topic], rescue_discarded=False
    )
    app.add_message_listener(received.put, topic=topic, group="rescue-off-points")
    with app:
        assert app.rescuers == {}
        broker.advance(3600)
        with pytest.raises(queue.Empty):
            received.get(timeout=0.5)
    assert UNIQ_KEY  # the module's names are the ones the product uses


def test_a_rescued_copy_of_a_delivered_transaction_is_absorbed_by_an_idempotent_consumer(
    make_app: Callable[..., TxMsg], broker: Any, tmp_path: Any
) -> None:
    """The broker also discards re-put copies of transactions a check-back already committed
    (docs/rocketmq-facts.md): the rescuer sends those again too, and the dedup key it carries is
    the one the first delivery was de-duplicated by."""
    from sqlalchemy.orm import Session  # noqa: PLC0415 - only this test needs SQLAlchemy

    import txmsg.sqla as sqla  # noqa: PLC0415

    topic = transaction_topic(broker, "rescue-double")
    engine = sqla.create_engine(f"sqlite:///{tmp_path / 'points.db'}")
    sqla.create_tables(engine)
    sessions = sqla.make_session_factory(engine)
    applied: list[Any] = []

    def add_points(message: Message, session: Session) -> None:
        applied.append(message.json())

    ledger = Ledger(down=False)
    app = make_app()
    app.add_transactional_listener(listener_class(ledger), group=GROUP, topics=[topic])
    app.add_message_listener(
        add_points,
        topic=topic,
        group="rescue-double-points",
        idempotent=True,
        session_factory=sessions,
    )
    with app:
        sent = app.transactional_producer(GROUP).send_in_transaction(
            topic, {"order": 6}, arg="commit", keys="order-6"
        )
        broker.advance(60)  # its check-back commits it: delivered once
        advance_until(broker, lambda: sqla.consumed_count(sessions) == 1)
        # the copy the broker would have discarded after that commit, as the rescuer reads it
        copy = Message(
            topic="TRANS_CHECK_MAX_TIME_TOPIC",
            body=b'{"order": 6}',
            keys="order-6",
            properties={
                UNIQ_KEY: sent.transaction_key,
                "REAL_TOPIC": topic,
                "REAL_QID": "0",
                "PGROUP": GROUP,
                "TRAN_MSG": "true",
                "TRANSACTION_CHECK_TIMES": "3",
            },
            message_id="DISCARDED-COPY",
        )
        rescuer = app.rescuers[GROUP]
        assert rescuer(copy) is True  # check_local: COMMIT, so it is sent again
        assert rescuer.stats().rescued == 1
        advance_until(broker, lambda: sqla.duplicates_absorbed(sessions) == 1)
        assert sqla.consumed_count(sessions) == 1
        assert applied == [{"order": 6}]
    engine.dispose()
