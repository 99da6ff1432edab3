"""TxMsg and TransactionalProducer over the backend test double."""

from __future__ import annotations

import sys
import threading
import types
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint

import pytest
from txmsg_broker.testing import wait_until

import txmsg.app
from txmsg import (
    BackendUnavailableError,
    ClosedError,
    ConfigError,
    ExecutorConfig,
    InvalidMessageError,
    InvalidNameError,
    LifecycleError,
    ListenerDefinitionError,
    ListenerRegistry,
    Message,
    NotStartedError,
    ProducerClosedError,
    RejectedError,
    SendError,
    TxMsg,
    TxMsgConfig,
    UnknownGroupError,
)
from txmsg import LocalTransactionState as S
from txmsg.message import OutgoingMessage, SendResult

from .doubles import DoubleBackend


class Recorder:
    """A listener that answers what it is told and records what it saw."""

    def __init__(self) -> None:
        self.executed: list[tuple[Message, object, str]] = []
        self.checked: list[tuple[Message, str]] = []
        self.answer: object = S.COMMIT
        self.check_answer: object = S.COMMIT

    def execute_local(self, message: Message, arg: object) -> object:
        self.executed.append((message, arg, threading.current_thread().name))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def check_local(self, message: Message) -> object:
        self.checked.append((message, threading.current_thread().name))
        return self.check_answer


@dataclass
class PlainSender:
    """The plain-send client of :class:`PlainToo`: accepts every message."""

    group: str
    sent: list[OutgoingMessage] = field(default_factory=list)

    def send(self, message: OutgoingMessage) -> SendResult:
        self.sent.append(message)
        return SendResult(message_id=f"P{len(self.sent)}", send_status="SEND_OK")

    def close(self, timeout: float | None = None) -> None:
        pass


@dataclass
class PlainToo(DoubleBackend):
    """The test double with plain-send clients too (``app.add_producer``)."""

    plain: dict[str, PlainSender] = field(default_factory=dict)

    def create_sender(self, group: str) -> PlainSender:
        self.plain[group] = PlainSender(group)
        return self.plain[group]


def started(
    app: TxMsg, registry: ListenerRegistry, group: str = "order-tx", **kw: object
) -> Recorder:
    listener = Recorder()
    app.add_transactional_listener(listener, group=group, topics=["orders"], **kw)  # type: ignore[arg-type]
    app.start()
    return listener


def test_send_runs_execute_local_in_the_calling_thread_with_the_arg(
    app: TxMsg, registry: ListenerRegistry, backend: DoubleBackend
) -> None:
    listener = started(app, registry)
    arg = {"order": object()}  # not representable as a C void*: must travel by closure
    result = app.producer().send_in_transaction(
        "orders", {"id": 1}, arg=arg, keys=["o-1", "c-9"], tags="paid", properties={"n": 1}
    )
    message, seen_arg, thread = listener.executed[0]
    assert seen_arg is arg
    assert thread == threading.current_thread().name
    assert message.json() == {"id": 1}
    assert message.keys == "o-1 c-9"
    assert message.tags == "paid"
    assert message.properties["n"] == "1"
    assert result.local_state is S.COMMIT
    assert result.send_status == "SEND_OK"
    assert result.transaction_key == message.transaction_key
    assert backend.senders["order-tx"].ended[0].state is S.COMMIT


@pytest.mark.parametrize(
    ("answer", "configured", "expected"),
    [
        (RuntimeError("db down"), S.UNKNOW, S.UNKNOW),
        (RuntimeError("db down"), S.ROLLBACK, S.ROLLBACK),
        ("COMMIT", S.UNKNOW, S.UNKNOW),
        (None, S.ROLLBACK, S.ROLLBACK),
        (S.ROLLBACK, S.UNKNOW, S.ROLLBACK),
    ],
)
def test_local_state_is_the_mapped_answer(
    app: TxMsg,
    registry: ListenerRegistry,
    backend: DoubleBackend,
    answer: object,
    configured: S,
    expected: S,
) -> None:
    listener = started(app, registry, execute_exception_state=configured)
    listener.answer = answer
    result = app.producer("order-tx").send_in_transaction("orders", b"x")
    assert result.local_state is expected
    assert backend.senders["order-tx"].ended[-1].state is expected  # what the broker was told
    assert app.stats()["order-tx"].sent == 1


def test_check_backs_reach_check_local_on_the_executor(
    app: TxMsg, registry: ListenerRegistry, backend: DoubleBackend
) -> None:
    listener = started(app, registry, executor=ExecutorConfig(concurrency=6))
    listener.answer = S.UNKNOW
    result = app.producer().send_in_transaction("orders", "pending")
    sender = backend.senders["order-tx"]
    assert sender.check_concurrency == 6
    assert sender.topics == ("orders",)
    listener.check_answer = S.ROLLBACK
    assert sender.check(result.transaction_key) is S.ROLLBACK
    message, thread = listener.checked[0]
    assert message.transaction_key == result.transaction_key
    assert thread.startswith("txmsg-order-tx")
    listener.check_answer = ValueError("bug")
    assert sender.check(result.transaction_key) is S.UNKNOW


def test_async_send_runs_on_the_listener_executor(app: TxMsg, registry: ListenerRegistry) -> None:
    listener = started(app, registry)
    future = app.producer().send_in_transaction_async("orders", "x", arg=5)
    assert future.result(10).local_state is S.COMMIT
    assert listener.executed[0][1] == 5
    assert listener.executed[0][2].startswith("txmsg-order-tx")


def test_async_send_rejection_policies(app: TxMsg, registry: ListenerRegistry) -> None:
    release = threading.Event()
    listener = started(
        app, registry, executor={"concurrency": 1, "queue_capacity": 0, "rejection": "abort"}
    )

    def block(message: Message, arg: object) -> S:
        release.wait(30)
        return S.COMMIT

    listener.execute_local = block  # type: ignore[method-assign]
    producer = app.producer()
    busy = producer.send_in_transaction_async("orders", "a")
    wait_until(
        lambda: producer.executor.stats().active == 1,
        timeout=10,
        message="the only thread to be busy",
    )
    try:
        with pytest.raises(RejectedError, match="rejection='abort'"):
            producer.send_in_transaction_async("orders", "b")
    finally:
        release.set()
    assert busy.result(10).local_state is S.COMMIT


def test_send_failures_become_send_error(
    app: TxMsg, registry: ListenerRegistry, backend: DoubleBackend
) -> None:
    started(app, registry)
    backend.senders["order-tx"].fail_with = OSError("connection reset")
    with pytest.raises(SendError, match=r"connection reset.*txmsg doctor"):
        app.producer().send_in_transaction("orders", "x")
    assert app.stats()["order-tx"].failed == 1


def test_producer_lookup_errors(app: TxMsg, registry: ListenerRegistry) -> None:
    with pytest.raises(NotStartedError, match=r"call app\.start"):
        app.producer()
    started(app, registry, group="a-tx")
    with pytest.raises(
        UnknownGroupError,
        match=r"no transactional listener for producer group 'b-tx' \(registered: a-tx\)",
    ) as info:
        app.producer("b-tx")
    assert info.value.group == "b-tx"
    assert isinstance(info.value, LookupError)


def test_default_group_from_config(backend: DoubleBackend) -> None:
    registry = ListenerRegistry()
    registry.add_transactional_listener(Recorder(), group="a-tx")
    registry.add_transactional_listener(Recorder(), group="b-tx")
    app = TxMsg(TxMsgConfig(producer={"group": "b-tx"}), backend=backend)  # type: ignore[arg-type]
    app.include(registry)
    with app:
        assert app.producer().group == "b-tx"
    app2 = TxMsg(TxMsgConfig(), backend=DoubleBackend())
    app2.include(registry)
    with app2, pytest.raises(UnknownGroupError, match="several producer groups"):
        app2.producer()


def test_config_overrides_decorator_executor(backend: DoubleBackend) -> None:
    config = TxMsgConfig(listeners={"order-tx": {"concurrency": 20}})  # type: ignore[dict-item]
    app = TxMsg(config, backend=backend)
    app.add_transactional_listener(Recorder(), group="order-tx", executor={"concurrency": 3})
    with app:
        assert app.producer().executor.config.concurrency == 20
        assert backend.senders["order-tx"].check_concurrency == 20


def test_decorated_classes_are_instantiated_by_the_factory(backend: DoubleBackend) -> None:
    registry = ListenerRegistry()  # a module-level registry, included into several apps

    @registry.transactional_listener(group="order-tx")
    class Needs(Recorder):
        def __init__(self, dep: str) -> None:
            super().__init__()
            self.dep = dep

    app = TxMsg(TxMsgConfig(), backend=backend)
    app.include(registry)
    with pytest.raises(ListenerDefinitionError, match=r"listener_factory=.*use_listener"):
        app.start()
    assert backend.senders == {}
    made = TxMsg(TxMsgConfig(), backend=DoubleBackend(), listener_factory=lambda cls: cls("db"))
    made.include(registry)
    with made:
        assert made.producer().listener.dep == "db"
    chosen = Needs("mine")
    used = TxMsg(TxMsgConfig(), backend=DoubleBackend())
    used.include(registry)
    used.use_listener(chosen)
    with used:
        assert used.producer().listener is chosen


def test_consumers_are_subscribed_with_a_safe_handler(app: TxMsg, backend: DoubleBackend) -> None:
    got: list[bytes] = []

    @app.message_listener(topic="orders", group="points", concurrency=3)
    def points(message: Message) -> None:
        if message.body == b"boom":
            raise RuntimeError("boom")
        got.append(message.body)

    app.start()
    sub = backend.subscriptions["points"]
    assert (sub.topic, sub.concurrency) == ("orders", 3)
    assert sub.handler(Message(topic="orders", body=b"ok")) is True
    assert sub.handler(Message(topic="orders", body=b"boom")) is False
    assert got == [b"ok"]
    app.close()
    assert sub.stopped
    assert backend.closed is False  # the app did not create this backend


def test_consume_from_defaults_to_first_and_is_configurable() -> None:
    """``first`` by default (librocketmq 2.1.0 skips messages with ``last`` when an offset query
    times out); ``[consumers.<group>] consume_from = "last"`` restores RocketMQ's default."""
    backend = DoubleBackend()
    config = TxMsgConfig.model_validate({"consumers": {"audit": {"consume_from": "last"}}})
    app = TxMsg(config, backend=backend)
    app.message_listener(topic="orders", group="points")(lambda m: None)
    app.message_listener(topic="orders", group="audit")(lambda m: None)
    with app:
        assert backend.subscriptions["points"].consume_from == "first"
        assert backend.subscriptions["audit"].consume_from == "last"
    with pytest.raises(ConfigError, match="consume_from"):
        TxMsgConfig.model_validate({"consumers": {"audit": {"consume_from": "middle"}}})


def test_registration_after_start_is_refused(app: TxMsg, registry: ListenerRegistry) -> None:
    app.start()
    with pytest.raises(LifecycleError, match=r"already started.*before app.start\(\)"):
        app.add_transactional_listener(Recorder(), group="late-tx")
    with pytest.raises(LifecycleError, match=r"before app\.start"):
        app.message_listener(topic="orders", group="late")(lambda m: None)
    with pytest.raises(LifecycleError, match="frozen because"):
        registry.add_transactional_listener(Recorder(), group="late-tx")
    with pytest.raises(LifecycleError):
        app.include(ListenerRegistry())
    assert "late-tx" not in app.producers


def test_close_closes_producers_and_refuses_sends(
    app: TxMsg, registry: ListenerRegistry, backend: DoubleBackend
) -> None:
    started(app, registry)
    producer = app.producer()
    app.close(timeout=3)
    assert backend.senders["order-tx"].closed_with == 3
    assert producer.executor.is_shutdown
    with pytest.raises(ProducerClosedError, match="closed"):
        producer.send_in_transaction("orders", "x")
    with pytest.raises(ClosedError, match="create a new TxMsg"):
        app.start()
    with pytest.raises(ClosedError):
        app.producer()


def test_failed_start_closes_what_started() -> None:
    backend = DoubleBackend()
    app = TxMsg(TxMsgConfig(), backend=backend)
    app.add_transactional_listener(Recorder(), group="a-tx")
    app.add_transactional_listener(Recorder(), group="b-tx")
    original = backend.create_transactional_sender

    def second_fails(group: str, *a: object, **kw: object) -> object:
        if group == "b-tx":
            raise OSError("no route")
        return original(group, *a, **kw)  # type: ignore[arg-type]

    backend.create_transactional_sender = second_fails  # type: ignore[method-assign]
    with pytest.raises(OSError, match="no route"):
        app.start()
    assert backend.senders["a-tx"].closed_with != "open"


def test_a_failed_start_leaves_the_app_open_for_a_fix_and_a_retry() -> None:
    """start() promises that a failed start can be fixed and retried: the registry must not
    stay frozen, and the retry builds fresh listeners (the failed start closed the first)."""
    backend = PlainToo(fail_create=OSError("broker not up yet"))
    made: list[Recorder] = []

    def factory(cls: type[Recorder]) -> Recorder:
        made.append(cls())
        return made[-1]

    app = TxMsg(TxMsgConfig(), backend=backend, listener_factory=factory)
    app.add_transactional_listener(Recorder, group="order-tx", topics=["orders"])
    with pytest.raises(OSError, match="not up yet"):
        app.start()
    assert not app.started
    assert not app.registry.frozen
    app.add_producer(group="notify")  # the fix: what the failed start showed was missing
    backend.fail_create = None
    with app:
        assert app.registry.frozen
        assert sorted(app.producers) == ["notify", "order-tx"]
        assert app.producer("notify").send("events", b"n").send_status == "SEND_OK"
        assert app.producer("order-tx").send_in_transaction("orders", b"o").local_state is S.COMMIT
        assert len(made) == 2
        assert app.producer("order-tx").listener is made[1]
        assert made[1].executed
        assert not made[0].executed
    with pytest.raises(LifecycleError, match="frozen"):
        app.registry.add_producer(group="later")


def test_backend_found_through_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("txmsg_test_backend")
    module.Backend = DoubleBackend  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "txmsg_test_backend", module)
    ep = EntryPoint(name="double", value="txmsg_test_backend:Backend", group="txmsg.backends")
    monkeypatch.setattr(txmsg.app, "backend_entry_points", lambda: [ep])
    app = TxMsg(TxMsgConfig(backend="double"))
    assert isinstance(app.backend, DoubleBackend)
    assert app.backend.config is app.config
    app.close()
    assert app.backend.closed  # created by the app, so closed by it


def test_missing_backend_names_the_pip_fix() -> None:
    """A pip user has no Makefile: the message names what to install (the backend's extra, or
    the distribution that provides the name) and `txmsg doctor`."""
    app = TxMsg(TxMsgConfig(backend="nope"))
    with pytest.raises(BackendUnavailableError, match=r"no txmsg backend named 'nope'") as caught:
        app.start()
    text = str(caught.value)
    assert "rocketmq" in text  # the installed ones
    assert "install the distribution that provides the backend 'nope'" in text
    assert "txmsg doctor" in text
    assert "Run `make setup`" not in text  # a secondary hint at most
    with pytest.raises(BackendUnavailableError, match=r"cannot be imported") as caught:
        txmsg.app.load_backend_factory("no_such_module:Backend")
    assert "install the distribution that provides 'no_such_module'" in str(caught.value)
    assert "Run `make setup`" not in str(caught.value)


@pytest.mark.parametrize("name", ["rocketmq", "rocketmq5"])
def test_a_missing_known_backend_names_its_extra(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txmsg.app, "backend_entry_points", lambda: [])
    with pytest.raises(BackendUnavailableError) as caught:
        txmsg.app.load_backend_factory(name)
    text = str(caught.value)
    assert f"pip install 'txmsg[{name}]'" in text
    assert "txmsg doctor" in text
    assert "Run `make setup`" not in text


def test_a_backend_that_fails_to_load_or_start_names_its_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("txmsg_test_broken")

    def refuse(config: object) -> object:
        raise OSError("librocketmq.so: cannot open shared object file")

    module.Backend = refuse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "txmsg_test_broken", module)
    loads = EntryPoint(name="rocketmq", value="txmsg_test_broken:Backend", group="txmsg.backends")
    broken = EntryPoint(name="rocketmq5", value="txmsg_test_broken:Missing", group="txmsg.backends")
    monkeypatch.setattr(txmsg.app, "backend_entry_points", lambda: [loads, broken])
    with pytest.raises(BackendUnavailableError, match="failed to load") as caught:
        txmsg.app.load_backend_factory("rocketmq5")
    assert "pip install 'txmsg[rocketmq5]'" in str(caught.value)
    with pytest.raises(BackendUnavailableError, match="could not start") as caught:
        txmsg.app.load_backend("rocketmq", TxMsgConfig())
    assert "pip install 'txmsg[rocketmq]'" in str(caught.value)
    assert "txmsg doctor" in str(caught.value)


def test_rocketmq_backend_is_registered() -> None:
    assert "rocketmq" in {ep.name for ep in txmsg.app.backend_entry_points()}


def test_send_argument_errors(app: TxMsg, registry: ListenerRegistry) -> None:
    listener = started(app, registry)
    producer = app.producer()
    with pytest.raises(InvalidNameError, match="topic 'bad topic' is not accepted") as info:
        producer.send_in_transaction("bad topic", "x")
    assert info.value.kind == "topic"
    with pytest.raises(InvalidMessageError, match="check_immunity_seconds must be a positive int"):
        producer.send_in_transaction("orders", "x", check_immunity_seconds=0)
    with pytest.raises(InvalidMessageError, match="register_converter"):
        producer.send_in_transaction("orders", object())
    assert listener.executed == []  # nothing was sent, nothing ran


def test_imperative_consumer_registration(app: TxMsg, backend: DoubleBackend) -> None:
    def audit(message: Message) -> None: ...

    assert app.add_message_listener(audit, topic="orders", group="audit", tags="paid").fn is audit
    app.start()
    assert backend.subscriptions["audit"].tags == "paid"
