"""txmsg's telemetry hooks without a broker: lazy loading, the no-op path, errors on spans."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from core.doubles import DoubleBackend
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from txmsg_broker.testing import unique

from txmsg import LocalTransactionState, Message, SendError, TxMsg, TxMsgConfig
from txmsg.message import OutgoingMessage
from txmsg.otel import hooks, names

from .conftest import Telemetry

S = LocalTransactionState


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_importing_txmsg_loads_no_opentelemetry() -> None:
    out = _run(
        """
        import sys
        import txmsg
        from txmsg import TxMsg, TxMsgConfig
        import txmsg.producer, txmsg.dispatch, txmsg.consumer, txmsg.app
        print("LOADED", sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    assert "LOADED []" in out, out


def test_without_the_api_every_hook_is_a_no_op() -> None:
    """The extra absent: ``opentelemetry`` cannot be imported; sends, checks and deliveries pass
    through unchanged and nothing raises."""
    out = _run(
        """
        import sys
        sys.modules["opentelemetry"] = None  # ImportError on any import of it
        from txmsg.message import Message, OutgoingMessage
        from txmsg.otel import gauges, hooks
        from txmsg.otel._runtime import otel
        from txmsg.states import LocalTransactionState
        message = OutgoingMessage(topic="t", body=b"x", properties={"a": "1"})
        with hooks.sending("g", message, transactional=True) as sending:
            assert sending.message is message
            sending.sent("id")
            sending.local_state(LocalTransactionState.COMMIT)
        handler = lambda m: True
        assert hooks.processing(handler, group="g", topic="t", max_reconsume=1, orderly=False) is handler
        checks = hooks.CheckTelemetry("g")
        assert not checks.enabled
        checking = checks.checking(Message(topic="t", body=b""))
        checking.answer(LocalTransactionState.COMMIT)
        checking.close()
        checks.answered(Message(topic="t", body=b""), LocalTransactionState.COMMIT, checks.started())
        hooks.record_exception(ValueError("x"))
        hooks.add_event("e", {})
        assert gauges.watch_executor("g", object()) == []
        assert otel() is None
        print("OK")
        """
    )
    assert "OK" in out


class Failing:
    def execute_local(self, message: Message, arg: Any) -> S:
        raise RuntimeError("database down")

    def check_local(self, message: Message) -> S:
        raise LookupError("no row")


@pytest.fixture
def double_app() -> Iterator[tuple[TxMsg, DoubleBackend]]:
    backend = DoubleBackend()
    app = TxMsg(TxMsgConfig(), backend=backend)
    yield app, backend
    app.close(timeout=5)


def test_listener_exceptions_are_recorded_on_the_send_and_check_spans(
    telemetry: Telemetry, double_app: tuple[TxMsg, DoubleBackend]
) -> None:
    app, backend = double_app
    group, topic = unique("pg_oe"), unique("oe")
    app.add_transactional_listener(Failing(), group=group, topics=[topic])
    app.start()
    result = app.transactional_producer(group).send_in_transaction(topic, "x")
    assert result.local_state is S.UNKNOW
    assert backend.senders[group].check(result.transaction_key) is S.UNKNOW

    (send,) = telemetry.spans(f"send {topic}")
    assert send.kind is SpanKind.PRODUCER
    assert send.status.status_code is StatusCode.ERROR
    (exception,) = [e for e in send.events if e.name == "exception"]
    assert exception.attributes["exception.type"] == "RuntimeError"
    assert send.attributes[names.LOCAL_RESULT] == "unknown"
    (check,) = telemetry.spans(f"check {topic}")
    assert check.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in check.events] == ["LookupError"]
    assert check.attributes[names.CHECK_RESULT] == "unknown"
    assert [link.context.span_id for link in check.links] == [send.context.span_id]
    stats = app.stats()[group]
    unknown = telemetry.total(
        names.LOCAL_TRANSACTIONS,
        txmsg__producer__group=group,
        txmsg__local_transaction__result="unknown",
    )
    assert unknown == stats.unknown == 1
    checks = telemetry.total(
        names.CHECKS, txmsg__producer__group=group, txmsg__check__result="unknown"
    )
    assert checks == stats.checks.checks == 1


def test_a_failed_send_has_its_error_type_on_the_span_and_the_counter(
    telemetry: Telemetry, double_app: tuple[TxMsg, DoubleBackend]
) -> None:
    app, backend = double_app
    group, topic = unique("pg_os"), unique("os")
    app.add_transactional_listener(Failing(), group=group, topics=[topic])
    app.start()
    backend.senders[group].fail_with = ConnectionError("broker gone")
    with pytest.raises(SendError):
        app.transactional_producer(group).send_in_transaction(topic, "x")
    (send,) = telemetry.spans(f"send {topic}")
    assert send.attributes[names.ERROR_TYPE] == "SendError"
    assert send.status.status_code is StatusCode.ERROR
    failed = telemetry.total(
        names.SENT_MESSAGES, txmsg__producer__group=group, error__type="SendError"
    )
    assert failed == app.stats()[group].failed == 1


def test_a_context_the_caller_put_in_the_properties_is_kept(
    telemetry: Telemetry, double_app: tuple[TxMsg, DoubleBackend]
) -> None:
    app, _ = double_app
    group, topic = unique("pg_oc"), unique("oc")
    seen: list[Message] = []

    class Keep:
        def execute_local(self, message: Message, arg: Any) -> S:
            seen.append(message)
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    app.add_transactional_listener(Keep(), group=group, topics=[topic])
    app.start()
    producer = app.transactional_producer(group)
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    producer.send_in_transaction(topic, "x", properties={"traceparent": mine})
    producer.send_in_transaction(topic, "y")
    assert seen[0].properties["traceparent"] == mine
    (_, second) = telemetry.spans(f"send {topic}")
    assert seen[1].properties["traceparent"].split("-")[2] == format(second.context.span_id, "016x")


def test_an_async_transactional_send_is_a_child_of_the_callers_span(
    telemetry: Telemetry, double_app: tuple[TxMsg, DoubleBackend]
) -> None:
    app, _ = double_app
    group, topic = unique("pg_oa"), unique("oa")

    class Commit:
        def execute_local(self, message: Message, arg: Any) -> S:
            return S.COMMIT

        def check_local(self, message: Message) -> S:
            return S.COMMIT

    app.add_transactional_listener(Commit(), group=group, topics=[topic])
    app.start()
    with trace.get_tracer("app").start_as_current_span("request") as request:
        app.transactional_producer(group).send_in_transaction_async(topic, "x").result(30)
    (send,) = telemetry.spans(f"send {topic}")
    assert send.parent is not None
    assert send.parent.span_id == request.get_span_context().span_id


def test_counted_figures_keep_groups_topics_and_errors_apart(telemetry: Telemetry) -> None:
    """The message counters are tallied by txmsg and observed when the SDK collects: each
    attribute set has its own total, and a failed send or delivery its ``error.type``."""
    groups, topics = (unique("pg_ot"), unique("pg_ot")), (unique("ot"), unique("ot"))
    for n, (group, topic) in enumerate([(g, t) for g in groups for t in topics], start=1):
        for _ in range(n):
            with hooks.sending(group, OutgoingMessage(topic=topic, body=b"x")):
                pass
    failed_send = hooks.sending(groups[0], OutgoingMessage(topic=topics[0], body=b"x"), count=3)
    with pytest.raises(ConnectionError), failed_send:
        raise ConnectionError("broker gone")
    for group in groups:
        ok = hooks.processing(
            lambda m: True, group=group, topic=topics[0], max_reconsume=1, orderly=False
        )
        ok(Message(topic=topics[0], body=b""))
    failing = hooks.processing(
        lambda m: False, group=groups[1], topic=topics[0], max_reconsume=1, orderly=False
    )
    failing(Message(topic=topics[0], body=b""))

    def sent(group: str, topic: str, **match: Any) -> float:
        points = telemetry.points(
            names.SENT_MESSAGES, txmsg__producer__group=group, messaging__destination__name=topic
        )
        error = match.get("error")
        return sum(p.value for p in points if p.attributes.get(names.ERROR_TYPE) == error)

    assert [sent(g, t) for g in groups for t in topics] == [1, 2, 3, 4]
    assert sent(groups[0], topics[0], error="ConnectionError") == 3
    for group, failed in ((groups[0], 0), (groups[1], 1)):
        points = telemetry.points(names.CONSUMED_MESSAGES, messaging__consumer__group__name=group)
        assert sorted((p.attributes.get(names.ERROR_TYPE, ""), p.value) for p in points) == sorted(
            [("", 1)] + [("_OTHER", 1)] * failed
        )


def test_the_message_handed_on_carries_the_context_and_is_otherwise_the_same(
    telemetry: Telemetry,
) -> None:
    message = OutgoingMessage(
        topic=unique("oh"), body=b"x", tags="t", keys="a b", properties={"p": "1"}, delay_level=2
    )
    with hooks.sending(unique("pg_oh"), message) as sending:
        handed = sending.message
    assert handed is not message
    assert message.properties == {"p": "1"}
    assert set(handed.properties) == {"p", "traceparent"}
    assert handed == dataclasses.replace(message, properties=handed.properties)
    assert type(handed) is OutgoingMessage
