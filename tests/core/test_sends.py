"""Plain sends on ``Producer`` (issue 17.1) and the orderly wiring of the app, over the backend
test double extended with a plain ``MessageSender``.

The sender double records every ``OutgoingMessage`` the core hands it and answers like the real
clients do (a queue per sharding key, async futures completed on another thread), so these tests
check what the core builds and refuses; tests/rocketmq/test_plain_sends.py sends for real.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import injector
import pytest

import txmsg
from txmsg import (
    InvalidMessageError,
    InvalidNameError,
    LifecycleError,
    ListenerDefinitionError,
    ListenerRegistry,
    Message,
    ParkedEvent,
    Producer,
    ProducerClosedError,
    ProducerGroup,
    SendError,
    SendResult,
    TransactionalProducer,
    TxMsg,
    TxMsgConfig,
    TxMsgModule,
    UnknownGroupError,
    producer_for,
)
from txmsg import LocalTransactionState as S
from txmsg.backend import Capabilities, ConsumeHandler, MessageSender
from txmsg.message import SHARDING_KEY, UNIQ_KEY, OutgoingMessage
from txmsg.producer import SKEW_MIN_SENDS
from txmsg.sending import RowOptions

from .doubles import DoubleBackend, Subscription

QUEUES = 8


class PlainSender:
    """A MessageSender double: sharding key -> queue by a stable hash, like the real clients."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.sent: list[tuple[str, OutgoingMessage]] = []
        self.batches: list[list[OutgoingMessage]] = []
        self.closed_with: float | str | None = "open"
        self.fail_with: Exception | None = None
        self.lock = threading.Lock()
        self.pending: list[threading.Thread] = []
        self.release = threading.Event()  # async answers wait for it (set: answer at once)
        self.release.set()

    def _answer(self, message: OutgoingMessage, n: int) -> SendResult:
        """The answer to the ``n``-th message sent."""
        if self.fail_with is not None:
            raise self.fail_with
        queue = (
            None
            if message.sharding_key is None
            else zlib.crc32(message.sharding_key.encode()) % QUEUES
        )
        return SendResult(message_id=f"ID{n:06d}", send_status="SEND_OK", offset=n, queue_id=queue)

    def send(self, message: OutgoingMessage) -> SendResult:
        with self.lock:
            self.sent.append(("send", message))
            return self._answer(message, len(self.sent) - 1)

    def send_async(self, message: OutgoingMessage) -> Future[SendResult]:
        future: Future[SendResult] = Future()
        with self.lock:
            self.sent.append(("async", message))
            n = len(self.sent) - 1

        def answer() -> None:  # the real client completes futures on its own callback thread
            self.release.wait(10)
            try:
                with self.lock:
                    result = self._answer(message, n)
            except Exception as exc:  # noqa: BLE001 - handed to the future, as a client does
                future.set_exception(exc)
            else:
                future.set_result(result)

        thread = threading.Thread(target=answer, name="double-callback")
        self.pending.append(thread)
        thread.start()
        return future

    def send_oneway(self, message: OutgoingMessage) -> None:
        with self.lock:
            self.sent.append(("oneway", message))
            if self.fail_with is not None:
                raise self.fail_with

    def send_batch(self, messages: Sequence[OutgoingMessage]) -> SendResult:
        with self.lock:
            self.batches.append(list(messages))
            if self.fail_with is not None:
                raise self.fail_with
            return SendResult(",".join(f"B{i}" for i in range(len(messages))), "SEND_OK")

    def close(self, timeout: float | None = None) -> None:
        for thread in self.pending:
            thread.join(timeout)
        self.closed_with = timeout


@dataclass
class SendingBackend(DoubleBackend):
    """DoubleBackend plus ``create_sender`` and ``subscribe(orderly=...)``."""

    capabilities: Capabilities = field(default_factory=Capabilities)
    plain: dict[str, list[PlainSender]] = field(default_factory=dict)
    create_delay: float = 0.0
    orderly: dict[str, bool] = field(default_factory=dict)

    def create_sender(self, group: str) -> PlainSender:
        time.sleep(self.create_delay)  # a real client takes a while to start
        sender = PlainSender(group)
        self.plain.setdefault(group, []).append(sender)
        return sender

    def subscribe(
        self,
        topic: str,
        group: str,
        handler: ConsumeHandler,
        *,
        tags: str = "*",
        concurrency: int = 4,
        max_reconsume: int = 16,
        consume_from: str = "first",
        orderly: bool = False,
    ) -> Callable[[float], None]:
        self.orderly[group] = orderly
        return super().subscribe(
            topic,
            group,
            handler,
            tags=tags,
            concurrency=concurrency,
            max_reconsume=max_reconsume,
            consume_from=consume_from,
        )


class Commit:
    def execute_local(self, message: Message, arg: object) -> S:
        return S.COMMIT

    def check_local(self, message: Message) -> S:
        return S.COMMIT


@pytest.fixture
def sb() -> SendingBackend:
    return SendingBackend()


@pytest.fixture
def sapp(sb: SendingBackend) -> Iterator[TxMsg]:
    application = TxMsg(TxMsgConfig(), backend=sb)
    yield application
    application.close(timeout=5)


def plain_app(sapp: TxMsg, group: str = "notify") -> Producer:
    sapp.add_producer(group=group)
    sapp.start()
    return sapp.producer(group)


# ---- the producer types ------------------------------------------------------------------------
def test_transactional_producer_is_a_producer_and_exported() -> None:
    assert issubclass(TransactionalProducer, Producer)
    assert TransactionalProducer is not Producer
    assert txmsg.TransactionalProducer is TransactionalProducer
    assert {"Producer", "TransactionalProducer", "SendResult", "ParkedEvent"} <= set(txmsg.__all__)


def test_plain_group_sends_without_a_listener_and_its_client_starts_with_the_app(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    sapp.add_producer(group="notify")
    assert sb.plain == {}
    sapp.start()
    assert [s.group for s in sb.plain["notify"]] == ["notify"]  # at start, not at first send
    producer = sapp.producer("notify")
    assert sb.senders == {}  # no transactional client for a plain group

    result = producer.send(
        "events", {"id": 7}, keys=["o-7", "c-1"], tags="paid", properties={"n": 3}
    )
    kind, message = sb.plain["notify"][0].sent[0]
    assert (kind, result.send_status, result.message_id) == ("send", "SEND_OK", "ID000000")
    assert message.topic == "events"
    assert Message(topic=message.topic, body=message.body).json() == {"id": 7}
    assert (message.keys, message.tags, dict(message.properties)) == ("o-7 c-1", "paid", {"n": "3"})
    assert (message.sharding_key, message.delay_level, message.deliver_at_ms) == (None, None, None)
    stats = producer.stats()
    assert (stats.transactional, stats.plain_sent, stats.sent, stats.executor.threads) == (
        False,
        1,
        0,
        0,
    )


def test_a_plain_group_cannot_send_in_a_transaction_and_says_how(sapp: TxMsg) -> None:
    plain_app(sapp)  # the plain Producer has no send_in_transaction; the lookup says why
    with pytest.raises(UnknownGroupError, match=r"@app\.transactional_listener\(group='notify'\)"):
        sapp.transactional_producer("notify")


def test_unknown_group_names_both_ways_to_declare_it(sapp: TxMsg) -> None:
    plain_app(sapp)
    with pytest.raises(UnknownGroupError, match=r"app\.add_producer\(group='other'\)") as info:
        sapp.producer("other")
    assert "@app.transactional_listener(group='other')" in str(info.value)


def test_a_transactional_group_opens_its_plain_client_once_on_the_first_plain_send(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    sapp.add_transactional_listener(Commit(), group="order-tx", topics=["orders"])
    sapp.start()
    producer = sapp.producer("order-tx")
    producer.send_in_transaction("orders", {"id": 1})
    assert sb.plain == {}  # transactional sends alone open nothing new

    sb.create_delay = 0.2
    barrier = threading.Barrier(6)
    results: list[SendResult] = []

    def first_send() -> None:
        barrier.wait()
        results.append(producer.send("events", "x"))

    threads = [threading.Thread(target=first_send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 6
    assert len(sb.plain["order-tx"]) == 1  # one client however many first sends raced
    sapp.close(timeout=4)
    assert sb.plain["order-tx"][0].closed_with == 4
    assert sb.senders["order-tx"].closed_with == 4


def test_add_producer_on_a_transactional_group_starts_the_plain_client_at_start(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    sapp.add_transactional_listener(Commit(), group="order-tx", topics=["orders"])
    sapp.add_producer(group="order-tx")
    sapp.start()
    assert len(sb.plain["order-tx"]) == 1
    assert sapp.producer("order-tx").transactional
    assert set(sapp.producers) == {"order-tx"}


# ---- message options ---------------------------------------------------------------------------
@pytest.mark.parametrize("level", [0, 19, -1, True, "3", 2.0])
def test_delay_levels_outside_1_to_18_are_refused(sapp: TxMsg, level: Any) -> None:
    producer = plain_app(sapp)
    with pytest.raises(InvalidMessageError, match=r"delay_level must be an int 1\.\.18 \(1=1s"):
        producer.send("events", "x", delay_level=level)


def test_delay_levels_reach_the_sender(sapp: TxMsg, sb: SendingBackend) -> None:
    producer = plain_app(sapp)
    producer.send("events", "x", delay_level=1)
    producer.send_async("events", "x", delay_level=18).result(5)
    producer.send_oneway("events", "x", delay_level=3)
    assert [m.delay_level for _, m in sb.plain["notify"][0].sent] == [1, 18, 3]


def test_deliver_at_on_a_backend_without_timer_messages_names_delay_level(sapp: TxMsg) -> None:
    producer = plain_app(sapp)  # Capabilities() default: delivery_timestamps=False (RocketMQ 4)
    with pytest.raises(
        InvalidMessageError, match=r"use delay_level=1\.\.18 instead \(1=1s.*18=2h\)"
    ):
        producer.send("events", "x", deliver_at=datetime.now(UTC) + timedelta(minutes=5))


def test_deliver_at_becomes_epoch_milliseconds_on_a_backend_with_timer_messages() -> None:
    backend = SendingBackend(capabilities=Capabilities(delivery_timestamps=True))
    app = TxMsg(TxMsgConfig(), backend=backend)
    try:
        producer = plain_app(app)
        when = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
        producer.send("events", "x", deliver_at=when)
        producer.send("events", "x", deliver_at=1_900_000_000.25)
        producer.send("events", "x", deliver_at=when.astimezone(timezone_plus_8()))
        sent = [m.deliver_at_ms for _, m in backend.plain["notify"][0].sent]
        assert sent == [1893553445678, 1900000000250, 1893553445678]
        with pytest.raises(InvalidMessageError, match="aware datetime"):
            producer.send("events", "x", deliver_at=datetime(2030, 1, 1))
        with pytest.raises(InvalidMessageError, match="not both"):
            producer.send("events", "x", deliver_at=when, delay_level=2)
        for bad in (float("nan"), -5, "tomorrow"):
            with pytest.raises(InvalidMessageError, match="deliver_at"):
                producer.send("events", "x", deliver_at=bad)  # type: ignore[arg-type]
    finally:
        app.close(timeout=5)


def timezone_plus_8() -> Any:
    from datetime import timezone  # noqa: PLC0415 - only this test needs another zone

    return timezone(timedelta(hours=8))


def test_send_orderly_carries_the_sharding_key_and_refuses_bad_keys(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    producer = plain_app(sapp)
    first = producer.send_orderly("events", {"step": 1}, sharding_key="order-1", tags="liability")
    second = producer.send_orderly_async("events", {"step": 2}, sharding_key="order-1").result(5)
    assert first.queue_id == second.queue_id is not None
    assert [m.sharding_key for _, m in sb.plain["notify"][0].sent] == ["order-1", "order-1"]
    for bad in ("", " ", None, 17, "k" * 256):
        with pytest.raises(InvalidMessageError, match="sharding_key must be a non-blank string"):
            producer.send_orderly("events", "x", sharding_key=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match=r"send_orderly\(\.\.\., sharding_key=\.\.\.\)"):
        producer.send("events", "x", properties={SHARDING_KEY: "order-1"})
    assert len(sb.plain["notify"][0].sent) == 2  # nothing refused reached the backend


def test_an_ordered_message_cannot_be_delayed(sapp: TxMsg) -> None:
    producer = plain_app(sapp)
    options = {"sharding_key": "order-1", "delay_level": 2}  # no public send takes both
    with pytest.raises(InvalidMessageError, match="ordered message cannot be delayed"):
        producer._plain("send", "events", "x", options, RowOptions)


def test_topic_names_are_checked_before_sending(sapp: TxMsg, sb: SendingBackend) -> None:
    producer = plain_app(sapp)
    with pytest.raises(InvalidNameError):
        producer.send("bad topic!", "x")
    with pytest.raises(InvalidNameError):
        producer.send_batch("bad topic!", ["x"])
    assert sb.plain["notify"][0].sent == []


def test_send_batch_converts_each_payload_and_counts_each_message(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    producer = plain_app(sapp)
    result = producer.send_batch("events", ({"n": n} for n in range(3)), tags="t", keys="k")
    assert result.message_ids == ("B0", "B1", "B2")
    batch = sb.plain["notify"][0].batches[0]
    assert [(m.topic, m.tags, m.keys) for m in batch] == [("events", "t", "k")] * 3
    assert [Message(topic=m.topic, body=m.body).json() for m in batch] == [
        {"n": 0},
        {"n": 1},
        {"n": 2},
    ]
    assert producer.stats().plain_sent == 3
    with pytest.raises(InvalidMessageError, match="at least one"):
        producer.send_batch("events", [])


# ---- errors, async, oneway, close ---------------------------------------------------------------
def test_client_errors_become_send_errors_everywhere_and_are_counted(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    producer = plain_app(sapp)
    sender = sb.plain["notify"][0]
    sender.fail_with = ConnectionError("broker gone")
    with pytest.raises(SendError, match=r"group=notify topic=events.*broker gone.*txmsg doctor"):
        producer.send("events", "x")
    with pytest.raises(SendError):
        producer.send_oneway("events", "x")
    with pytest.raises(SendError):
        producer.send_batch("events", ["x"])
    future = producer.send_async("events", "x")
    with pytest.raises(SendError, match="broker gone"):
        future.result(5)
    sender.fail_with = InvalidMessageError("body over 4 MiB")
    with pytest.raises(InvalidMessageError, match="4 MiB"):  # the backend's own errors unchanged
        producer.send("events", "x")
    assert producer.stats().plain_failed == 5
    assert producer.stats().plain_sent == 0


def test_async_sends_end_on_the_clients_thread_and_count_when_answered(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    producer = plain_app(sapp)
    sb.plain["notify"][0].release.clear()  # the broker has not answered yet
    seen: list[str] = []
    futures = [producer.send_async("events", {"n": n}) for n in range(5)]
    futures[0].add_done_callback(lambda f: seen.append(threading.current_thread().name))
    assert not any(f.done() for f in futures)
    assert producer.stats().plain_sent == 0
    sb.plain["notify"][0].release.set()
    results = [f.result(5) for f in futures]
    assert [r.message_id for r in results] == [f"ID{n:06d}" for n in range(5)]
    assert producer.stats().plain_sent == 5
    assert seen == ["double-callback"]


def test_oneway_counts_what_the_client_took(sapp: TxMsg, sb: SendingBackend) -> None:
    producer = plain_app(sapp)
    producer.send_oneway("events", "x", tags="t")
    assert [k for k, _ in sb.plain["notify"][0].sent] == ["oneway"]
    assert producer.stats().plain_sent == 1


def test_after_close_every_send_is_refused_and_the_client_is_closed(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    producer = plain_app(sapp)
    pending = producer.send_async("events", "x")
    sapp.close(timeout=3)
    assert pending.done()  # close waited for the pending async send
    assert sb.plain["notify"][0].closed_with == 3
    calls: list[Callable[[], object]] = [
        lambda: producer.send("events", "x"),
        lambda: producer.send_async("events", "x"),
        lambda: producer.send_oneway("events", "x"),
        lambda: producer.send_orderly("events", "x", sharding_key="k"),
        lambda: producer.send_batch("events", ["x"]),
        producer.open_sender,
    ]
    for call in calls:
        with pytest.raises(ProducerClosedError):
            call()
    assert len(sb.plain["notify"]) == 1


def test_close_during_a_lazy_open_closes_the_client_it_opened(
    sapp: TxMsg, sb: SendingBackend
) -> None:
    sapp.add_transactional_listener(Commit(), group="order-tx", topics=["orders"])
    sapp.start()
    producer = sapp.producer("order-tx")
    sb.create_delay = 0.3
    opener = threading.Thread(target=producer.open_sender)
    opener.start()
    time.sleep(0.1)  # the opener holds the lock, creating the client
    producer.close(timeout=2)
    opener.join(5)
    assert [s.closed_with for s in sb.plain["order-tx"]] == [2]


# ---- queue skew --------------------------------------------------------------------------------
def test_a_hot_sharding_key_shows_as_skew_and_warns_once_per_topic(
    sapp: TxMsg, caplog: pytest.LogCaptureFixture
) -> None:
    producer = plain_app(sapp)
    caplog.set_level(logging.WARNING, logger="txmsg.producer")
    for n in range(SKEW_MIN_SENDS - 1):
        key = "hot" if n % 2 == 0 else f"order-{n}"  # half of everything on one key
        producer.send_orderly("events", {"n": n}, sharding_key=key)
    assert not caplog.records  # not judged before SKEW_MIN_SENDS ordered sends
    for n in range(60):
        producer.send_orderly("events", {"n": n}, sharding_key="hot")
    warnings = [r for r in caplog.records if "uneven" in r.getMessage()]
    assert len(warnings) == 1
    assert "topic=events" in warnings[0].getMessage()
    assert "sending.md" in warnings[0].getMessage()
    stats = producer.stats()
    assert stats.ordered_sent == SKEW_MIN_SENDS - 1 + 60
    assert sum(stats.queues.values()) == stats.ordered_sent
    assert stats.topic_queues == {"events": stats.queues}
    assert stats.queue_skew > 2.0


def test_many_keys_spread_evenly_and_do_not_warn(
    sapp: TxMsg, caplog: pytest.LogCaptureFixture
) -> None:
    producer = plain_app(sapp)
    caplog.set_level(logging.WARNING, logger="txmsg.producer")
    for n in range(800):
        producer.send_orderly("events", {"n": n}, sharding_key=f"tenant-{n % 7}:order-{n}")
    producer.send("events", "not ordered")
    stats = producer.stats()
    assert len(stats.queues) == QUEUES
    assert stats.queue_skew < 1.3
    assert (stats.ordered_sent, stats.plain_sent) == (800, 801)
    assert not [r for r in caplog.records if "uneven" in r.getMessage()]


# ---- declaring plain groups --------------------------------------------------------------------
def test_add_producer_names_include_and_freeze() -> None:
    registry = ListenerRegistry()
    registry.add_producer(group="module-notify")
    registry.add_producer(group="module-notify")  # twice is harmless
    with pytest.raises(InvalidNameError):
        registry.add_producer(group="bad group!")
    backend = SendingBackend()
    app = TxMsg(TxMsgConfig(), backend=backend)
    app.include(registry)
    assert app.registry.producer_groups == ("module-notify",)
    with pytest.raises(LifecycleError):
        registry.add_producer(group="late")
    with app:
        assert app.producer("module-notify").group == "module-notify"
        assert app.producer().group == "module-notify"  # the only group is the default
        with pytest.raises(LifecycleError, match=r"before app\.start"):
            app.add_producer(group="later")
        assert "module-notify" in repr(app)
    assert backend.plain["module-notify"][0].closed_with is not None


def test_config_producer_group_picks_a_plain_group_as_default() -> None:
    backend = SendingBackend()
    config = TxMsgConfig.model_validate({"producer": {"group": "notify"}})
    with TxMsg(config, backend=backend) as app_:
        pass
    app = TxMsg(config, backend=backend)
    app.add_transactional_listener(Commit(), group="order-tx")
    app.add_producer(group="notify")
    with app:
        assert app.producer().group == "notify"
        assert set(app.stats()) == {"order-tx", "notify"}
    assert app_.registry.producer_groups == ()


def test_di_binds_plain_groups_under_both_class_names(sapp: TxMsg) -> None:
    sapp.add_producer(group="notify")
    sapp.add_transactional_listener(Commit(), group="order-tx")
    inj = injector.Injector([TxMsgModule(sapp)])
    sapp.start()
    notify = inj.get(producer_for("notify"))
    assert notify is sapp.producer("notify")
    same_key: Any = Annotated[TransactionalProducer, ProducerGroup("notify")]
    with pytest.raises(UnknownGroupError, match="plain producer group"):
        inj.get(same_key)
    assert inj.get(producer_for("order-tx")).transactional


# ---- consumer-side wiring ----------------------------------------------------------------------
def test_orderly_listener_subscribes_orderly_and_parks_through_the_hooks(
    sapp: TxMsg, sb: SendingBackend, tmp_path: Path
) -> None:
    from txmsg.sqla import create_engine, create_tables, make_session_factory  # noqa: PLC0415

    # a file: the journal's sweeper thread needs a connection of its own (in-memory is refused)
    engine = create_engine(f"sqlite:///{tmp_path / 'refunds.db'}")
    create_tables(engine)
    sessions = make_session_factory(engine)
    events: list[ParkedEvent] = []
    registry = ListenerRegistry()

    @registry.on_parked
    def from_module(event: ParkedEvent) -> None:
        events.append(event)

    @sapp.on_parked
    def broken_hook(event: ParkedEvent) -> None:
        raise RuntimeError("pager down")  # logged, never stops consumption

    @sapp.message_listener(
        topic="events",
        group="refunds",
        orderly=True,
        session_factory=sessions,
        max_orderly_retries=2,
        orderly_retry_delay=0.0,
    )
    def refund(message: Message) -> None:
        raise ValueError("no liability decision yet")

    @sapp.message_listener(topic="events", group="audit")
    def audit(message: Message) -> None:
        pass

    sapp.include(registry)
    assert sapp.registry.parked_hooks == (broken_hook, from_module)
    sapp.start()
    assert sb.orderly == {"refunds": True, "audit": False}
    sub: Subscription = sb.subscriptions["refunds"]
    poison = Message(
        topic="events",
        body=b"{}",
        message_id="m1",
        sharding_key="order-1",
        properties={UNIQ_KEY: "m1", SHARDING_KEY: "order-1"},
    )
    assert sub.handler(poison) is True  # parked: the queue moves on
    assert [(e.group, e.sharding_key, e.attempts) for e in events] == [("refunds", "order-1", 2)]
    assert "no liability decision yet" in events[0].error
    engine.dispose()


def test_orderly_listener_on_a_backend_without_orderly_consumers_is_refused_at_start() -> None:
    backend = SendingBackend(capabilities=Capabilities(orderly_consumer=False))
    app = TxMsg(TxMsgConfig(), backend=backend)

    @app.message_listener(
        topic="events", group="refunds", orderly=True, session_factory=lambda: None
    )
    def refund(message: Message) -> None:
        pass

    with pytest.raises(ListenerDefinitionError, match=r"refunds.*no orderly consumer"):
        app.start()
    assert backend.subscriptions == {}
    app.close(timeout=1)


def test_on_parked_refuses_what_it_cannot_call() -> None:
    with pytest.raises(ListenerDefinitionError, match="ParkedEvent"):
        ListenerRegistry().on_parked("page me")  # type: ignore[type-var]


def test_the_sender_double_satisfies_the_protocol() -> None:
    assert isinstance(PlainSender("g"), MessageSender)
