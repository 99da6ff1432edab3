"""Plain sends, failing deliveries and parked keys through the embedded broker: span types,
events and figures (issue 28)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import SpanKind, StatusCode
from txmsg_broker.testing import create_group, create_topic, unique, wait_until

from txmsg import Message
from txmsg.otel import names
from txmsg.sqla import create_engine, create_tables, make_session_factory
from txmsg.sqla.parking import parked_key_count

from .conftest import Telemetry


@pytest.mark.parametrize("backend_name", ["rocketmq"])
def test_plain_sends_are_spans_and_counted_as_stats_counts_them(
    telemetry: Telemetry, make_app: Any, broker: Any
) -> None:
    topic, group, cgroup = unique("op"), unique("pg_op"), unique("cg_op")
    create_topic(broker.namesrv_addr, topic)
    got: list[Message] = []
    lock = threading.Lock()

    def consume(message: Message) -> None:
        with lock:
            got.append(message)

    app = make_app()
    app.add_producer(group=group)
    app.add_message_listener(consume, topic=topic, group=cgroup, concurrency=2)
    with app:
        producer = app.producer(group)
        producer.send(topic, "plain", keys=["a", "b"])
        producer.send(topic, "delayed", delay_level=1)
        producer.send_orderly(topic, "ordered", sharding_key="order-1")
        producer.send_async(topic, "async").result(timeout=30)
        producer.send_oneway(topic, "oneway")
        producer.send_batch(topic, ["b1", "b2", "b3"])
        wait_until(lambda: len(got) >= 8, timeout=60, message="8 deliveries")
        stats = producer.stats()

    sends = telemetry.spans(f"send {topic}")
    assert len(sends) == 6
    assert all(s.kind is SpanKind.PRODUCER for s in sends)
    kinds = sorted(s.attributes[names.ROCKETMQ_TYPE] for s in sends)
    assert kinds == ["delay", "fifo", "normal", "normal", "normal", "normal"]
    by_type = {s.attributes[names.ROCKETMQ_TYPE]: s for s in sends}
    assert by_type["delay"].attributes[names.ROCKETMQ_DELAY_LEVEL] == 1
    assert by_type["fifo"].attributes[names.ROCKETMQ_GROUP] == "order-1"
    batch = [s for s in sends if names.BATCH_COUNT in s.attributes]
    assert [s.attributes[names.BATCH_COUNT] for s in batch] == [3]
    # every delivery is in the trace of the send that produced it (the batch's three included)
    send_ids = {s.context.span_id for s in sends}
    processes = telemetry.spans(f"process {topic}")
    assert len(processes) == len(got) == 8
    assert all(p.parent is not None and p.parent.span_id in send_ids for p in processes)
    batch_children = [p for p in processes if p.parent.span_id == batch[0].context.span_id]
    assert len(batch_children) == 3
    assert telemetry.total(names.SENT_MESSAGES, txmsg__producer__group=group) == (stats.plain_sent)
    assert stats.plain_sent == 8
    assert telemetry.total(names.OPERATION_DURATION, txmsg__producer__group=group) == 6
    points = telemetry.points(names.SENT_MESSAGES, txmsg__producer__group=group)
    assert all(names.ERROR_TYPE not in p.attributes for p in points)
    # every delivery counted once, on the consumer group and the topic
    consumed = telemetry.total(names.CONSUMED_MESSAGES, messaging__consumer__group__name=cgroup)
    assert consumed == len(got) == 8
    assert telemetry.total(names.PROCESS_DURATION, messaging__consumer__group__name=cgroup) == 8
    (point,) = telemetry.points(names.CONSUMED_MESSAGES, messaging__consumer__group__name=cgroup)
    assert point.attributes[names.DESTINATION] == topic


def test_a_failing_listener_shows_retries_and_the_dead_letter_on_its_spans(
    telemetry: Telemetry, make_app: Any, broker: Any
) -> None:
    topic, group, cgroup = unique("of"), unique("pg_of"), unique("cg_of")
    create_topic(broker.namesrv_addr, topic)
    create_topic(broker.namesrv_addr, f"%DLQ%{cgroup}")
    calls: list[int] = []

    def fail(message: Message) -> None:
        calls.append(message.reconsume_times)
        raise ValueError("no such order")

    app = make_app()
    app.add_producer(group=group)
    app.add_message_listener(fail, topic=topic, group=cgroup, max_reconsume=1)
    with app:
        app.producer(group).send(topic, "doomed")
        wait_until(lambda: len(telemetry.spans(f"process {topic}")) >= 2, timeout=60)

    processes = sorted(
        telemetry.spans(f"process {topic}"), key=lambda s: s.attributes[names.RECONSUME_TIMES]
    )
    first, last = processes[0], processes[1]
    assert [first.attributes[names.RECONSUME_TIMES], last.attributes[names.RECONSUME_TIMES]] == [
        0,
        1,
    ]
    for span in (first, last):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[names.ERROR_TYPE] == "ValueError"
        exceptions = [e for e in span.events if e.name == "exception"]
        assert exceptions[0].attributes["exception.type"] == "ValueError"
    assert [e.name for e in first.events][-1] == names.EVENT_RETRY
    dead = [e for e in last.events if e.name == names.EVENT_DEAD_LETTER]
    assert dead[0].attributes[names.DESTINATION] == f"%DLQ%{cgroup}"
    failed = telemetry.total(
        names.CONSUMED_MESSAGES, messaging__consumer__group__name=cgroup, error__type="ValueError"
    )
    assert failed == len(calls) >= 2


@pytest.mark.parametrize("backend_name", ["rocketmq5"])
def test_a_parked_key_is_a_span_event_and_a_gauge(
    telemetry: Telemetry, make_app: Any, broker: Any, tmp_path: Path
) -> None:
    topic, group, cgroup = unique("ok"), unique("pg_ok"), unique("cg_ok")
    create_topic(broker.namesrv_addr, topic, queues=1, message_type="FIFO")
    create_group(broker.namesrv_addr, cgroup, orderly=True)
    engine = create_engine(f"sqlite:///{tmp_path / 'orderly.db'}")
    create_tables(engine)
    factory = make_session_factory(engine)
    handled: list[bytes] = []

    def consume(message: Message) -> None:
        if message.body == b"bad":
            raise KeyError("missing row")
        handled.append(message.body)

    app = make_app()
    app.add_producer(group=group)
    app.add_message_listener(
        consume,
        topic=topic,
        group=cgroup,
        orderly=True,
        max_orderly_retries=2,
        orderly_retry_delay=0,
        session_factory=factory,
    )
    try:
        with app:
            producer = app.producer(group)
            for body in ("bad", "after", "other"):
                key = "k-other" if body == "other" else "k-bad"
                producer.send_orderly(topic, body, sharding_key=key)
            wait_until(lambda: b"other" in handled, timeout=60, message="the other key flows")
            wait_until(lambda: len(telemetry.spans(f"process {topic}")) >= 3, timeout=30)
            parked = telemetry.total(names.PARKED_KEYS, messaging__consumer__group__name=cgroup)
            assert parked == parked_key_count(factory, cgroup) == 1
    finally:
        engine.dispose()
    spans = {s.attributes[names.MESSAGE_ID]: s for s in telemetry.spans(f"process {topic}")}
    events = {name for s in spans.values() for name in (e.name for e in s.events)}
    assert {names.EVENT_RETRY, names.EVENT_PARKED, names.EVENT_PARKED_BEHIND} <= events
    parking = next(s for s in spans.values() if any(e.name == names.EVENT_PARKED for e in s.events))
    assert parking.status.status_code is StatusCode.ERROR
    assert [e.attributes[names.ATTEMPT] for e in parking.events if e.name == names.EVENT_RETRY] == [
        1
    ]
