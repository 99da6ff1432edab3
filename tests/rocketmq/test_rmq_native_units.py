"""Pieces of the RocketMQ backend that need librocketmq but no broker."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import pytest
from txmsg_rocketmq import messages, native
from txmsg_rocketmq.backend import RocketMQBackend
from txmsg_rocketmq.callbacks import guarded, state_code
from txmsg_rocketmq.consumer import PushConsumer
from txmsg_rocketmq.doctor import report
from txmsg_rocketmq.gate import Gate
from txmsg_rocketmq.names import consumer_names_hazard, printf_hazard, refuse_printf_topic

from txmsg import InvalidNameError, TxMsg, TxMsgConfig
from txmsg.errors import BackendUnavailableError, ConfigError
from txmsg.message import OutgoingMessage
from txmsg.states import LocalTransactionState


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> native.Native:
    return native.load(tmp_path_factory.mktemp("rmq-client-logs"))


def test_escaping_exceptions_never_reach_ctypes(
    lib: native.Native, capfd: pytest.CaptureFixture[str]
) -> None:
    def explode(*_: object) -> int:
        raise RuntimeError("boom")

    def exit_now(*_: object) -> int:
        raise SystemExit(3)

    for body in (explode, exit_now):
        cb = native.CHECK_CALLBACK(guarded(native.E_UNKNOWN_TRANSACTION, "test", body))
        # Calling the CFUNCTYPE object goes through the C thunk, exactly like librocketmq does.
        assert cb(None, None, None) == native.E_UNKNOWN_TRANSACTION
    err = capfd.readouterr().err
    assert "Exception ignored on calling ctypes callback" not in err


def test_non_int_returns_become_the_fallback(lib: native.Native) -> None:
    cb = native.CHECK_CALLBACK(guarded(native.E_UNKNOWN_TRANSACTION, "test", lambda *_: "COMMIT"))
    assert cb(None, None, None) == native.E_UNKNOWN_TRANSACTION


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (LocalTransactionState.COMMIT, 0),
        (LocalTransactionState.ROLLBACK, 1),
        (LocalTransactionState.UNKNOWN, 2),
        ("commit", 0),
        (True, 2),
        (0, 2),
        (None, 2),
        ("maybe", 2),
    ],
)
def test_state_code_maps_only_real_states(value: object, code: int) -> None:
    assert state_code(value, what="test", key="k") == code


def test_message_round_trip_through_a_native_handle(lib: native.Native) -> None:
    body = b"\x00binary\x00payload\xff"
    out = OutgoingMessage(
        topic="orders",
        body=body,
        tags="created",
        keys="order-1",
        properties={"tenant": "acme", "trace": "t-1"},
        check_immunity_seconds=7,
    )
    handle = messages.build(lib, out)
    try:
        got = messages.read(lib, handle, origin=True)
    finally:
        lib.dll.DestroyMessage(handle)
    assert got.topic == "orders"
    assert got.body == body  # NUL bytes survive (base64 on the wire)
    assert got.tags == "created"
    assert got.keys == "order-1"
    assert isinstance(got.keys, str)
    assert got.properties["tenant"] == "acme"
    assert got.properties["trace"] == "t-1"


def test_plain_text_bodies_are_sent_unchanged(lib: native.Native) -> None:
    handle = messages.build(lib, OutgoingMessage(topic="t", body=b'{"a": 1}'))
    try:
        assert lib.dll.GetOriginMessageBody(handle) == b'{"a": 1}'
        assert lib.dll.GetOriginMessageProperty(handle, messages.ENCODING.encode()) in (b"", None)
    finally:
        lib.dll.DestroyMessage(handle)


@pytest.mark.parametrize(
    "props",
    [{"a,b": "x"}, {"a": "x\x01y"}, {messages.PROPS_LIST: "x"}, {"": "x"}],
)
def test_bad_properties_are_rejected_before_reaching_the_client(
    lib: native.Native, props: dict[str, str]
) -> None:
    with pytest.raises(ValueError, match="property"):
        messages.build(lib, OutgoingMessage(topic="t", body=b"x", properties=props))


def test_gate_waits_for_callbacks_and_then_refuses_new_ones() -> None:
    gate = Gate()
    assert gate.enter_callback()
    released = threading.Event()

    def finish_later() -> None:
        time.sleep(0.2)
        released.set()
        gate.exit_callback()

    threading.Thread(target=finish_later).start()
    assert gate.drain_and_shut(time.monotonic() + 5)
    assert released.is_set()  # drain really waited for the running callback
    assert not gate.enter_send()
    assert not gate.enter_callback()


def test_gate_times_out_and_reports_unsafe() -> None:
    gate = Gate()
    assert gate.enter_send()
    assert not gate.drain_and_shut(time.monotonic() + 0.05)
    # still open for callbacks: a check arriving now gets an honest answer
    assert gate.enter_callback()


@pytest.mark.parametrize(
    ("text", "hazard"),
    [
        ("%RETRY%stock-events", "%s"),
        ("%DLQ%notify", "%n"),
        ("%RETRY%-5s", "%-5s"),
        ("%RETRY%ls", "%ls"),
        ("%RETRY%1$x", "%1$"),
        ("%RETRY%order-events", None),
        ("%RETRY%cg-stock", None),
        ("%DLQ%dlq_group", None),
        ("100%%sure", None),
        ("plain", None),
    ],
)
def test_printf_hazards_in_names_are_found(text: str, hazard: str | None) -> None:
    assert printf_hazard(text) == hazard


def test_a_send_to_a_topic_librocketmq_would_crash_on_is_refused() -> None:
    """What the plain sender and the transaction pool check before every send."""
    with pytest.raises(
        InvalidNameError, match=r"'%sales' contains '%s'.*rename the topic"
    ) as raised:
        refuse_printf_topic("%sales")
    assert (raised.value.kind, raised.value.name) == ("topic", "%sales")
    refuse_printf_topic("100%%sure")


def test_consumer_groups_librocketmq_would_crash_on_are_refused(lib: native.Native) -> None:
    backend = RocketMQBackend(None, announce=False)
    with pytest.raises(InvalidNameError, match=r"librocketmq 2\.1\.0 uses as a printf conversion"):
        backend.subscribe("orders", "stock-events", lambda m: True)
    assert consumer_names_hazard("cg-stock-events", "orders") is None
    # the app applies the backend's rule at registration, long before start()
    app = TxMsg(TxMsgConfig(), backend="rocketmq")
    with pytest.raises(InvalidNameError, match=r"'%RETRY%stock-events'.*prefix it with 'cg-'"):
        app.message_listener(topic="orders", group="stock-events")(lambda m: None)
    app.message_listener(topic="orders", group="cg-stock-events")(lambda m: None)


def test_doctor_reports_the_library_and_a_producer_start(tmp_path: Any) -> None:
    class Config:
        name_server = "127.0.0.1:1"  # nothing listens: reported, but a producer still starts
        client_log_dir = str(tmp_path)

    checks = {label: (detail, ok) for label, detail, ok in report(Config())}
    assert checks["librocketmq sha256"][0] == native.LIB_SHA256_2_1_0
    assert checks["librocketmq is 2.1.0"][1] is True
    assert checks["name server reachable"][1] is False
    assert checks["transaction producer starts"][1] is True


def test_push_consumer_settings_reach_the_cpp_object(lib: native.Native) -> None:
    """The C++ setters called on the C handle land in the DefaultMQPushConsumer (read back through
    its exported getters): synchronous pulls on PULL_THREADS threads and CONSUME_FROM_FIRST."""

    dll = lib.dll
    get_where = dll._ZN8rocketmq21DefaultMQPushConsumer19getConsumeFromWhereEv
    get_where.argtypes, get_where.restype = [ctypes.c_void_p], ctypes.c_int
    get_threads = dll._ZNK8rocketmq21DefaultMQPushConsumer25getPullMsgThreadPoolCountEv
    get_threads.argtypes, get_threads.restype = [ctypes.c_void_p], ctypes.c_int
    with native.NATIVE_LOCK:
        handle = dll.CreatePushConsumer(b"txmsg_units_cg")
        try:
            assert get_where(handle) == native.CONSUME_FROM["last"]  # CreatePushConsumer's choice
            assert native.set_pull(lib, handle, sync=True)
            assert native.set_consume_from(lib, handle, native.CONSUME_FROM["first"])
            assert get_where(handle) == native.CONSUME_FROM["first"]
            assert get_threads(handle) == native.PULL_THREADS
        finally:
            native.release_push_consumer(lib, handle, started=False)  # never DestroyPushConsumer


def test_a_consumer_that_fails_to_start_is_parked_not_destroyed(lib: native.Native) -> None:
    """librocketmq 2.1.0 runs a timer thread from the consumer's constructor that only a RUNNING
    consumer's shutdown stops: destroying a consumer whose start failed frees memory that thread
    still writes (heap corruption; seen as a "malformed" fresh SQLite database in CI)."""
    settings: dict[str, Any] = {
        "group": "TXMSG_T_PARKED",
        "topic": "TXMSG_T_PARKED_TOPIC",
        "tags": "*",
        "handler": lambda m: True,
        "name_server": "127.0.0.1:1",  # never reached: start() does not wait for routes
        "instance_name": "parked-test",
        "concurrency": 1,
        "max_reconsume": 3,
    }
    first = PushConsumer(lib, **settings, pull_threads=5)
    get_threads = lib.dll._ZNK8rocketmq21DefaultMQPushConsumer25getPullMsgThreadPoolCountEv
    get_threads.argtypes, get_threads.restype = [ctypes.c_void_p], ctypes.c_int
    assert get_threads(first.handle) == 5  # the config key ``pull_threads`` reaches the client
    parked_before = len(native._NEVER_STARTED)
    try:
        # Same group on the same instance name: librocketmq refuses to start the second one.
        with pytest.raises(BackendUnavailableError, match="failed to start"):
            PushConsumer(lib, **settings)
        assert len(native._NEVER_STARTED) == parked_before + 1
        handle, kept = native._NEVER_STARTED[-1]
        assert handle
        assert isinstance(kept, native.MESSAGE_CALLBACK)  # its callback stays alive too
    finally:
        first.stop(timeout=5)


def test_pull_threads_from_the_configuration_reach_the_client(
    lib: native.Native, tmp_path: Any
) -> None:
    with pytest.raises(ConfigError, match="pull_threads"):
        TxMsgConfig.model_validate({"pull_threads": 0})
    config = TxMsgConfig.model_validate(
        {"name_server": "127.0.0.1:1", "pull_threads": 7, "client_log_dir": str(tmp_path)}
    )
    backend = RocketMQBackend(config, announce=False)
    stop = backend.subscribe("TXMSG_T_PT_TOPIC", "TXMSG_T_PT", lambda m: True)
    try:
        get_threads = lib.dll._ZNK8rocketmq21DefaultMQPushConsumer25getPullMsgThreadPoolCountEv
        get_threads.argtypes, get_threads.restype = [ctypes.c_void_p], ctypes.c_int
        assert get_threads(backend._consumers["TXMSG_T_PT"].handle) == 7
    finally:
        stop()
        backend.close()


def test_sync_pull_from_the_configuration_reaches_the_consumer(
    lib: native.Native, tmp_path: Any
) -> None:
    """``sync_pull = true``: synchronous pulls and no watcher; the default: held asynchronous
    pulls, watched (docs/librocketmq-hazards.md #5)."""
    for sync_pull in (True, False):
        config = TxMsgConfig.model_validate(
            {"name_server": "127.0.0.1:1", "sync_pull": sync_pull, "client_log_dir": str(tmp_path)}
        )
        backend = RocketMQBackend(config, announce=False)
        stop = backend.subscribe("TXMSG_T_SP_TOPIC", "TXMSG_T_SP", lambda m: True)
        try:
            consumer = backend._consumers["TXMSG_T_SP"]
            assert consumer.sync_pull is sync_pull
            assert (consumer.watcher is None) is sync_pull
        finally:
            stop()
            backend.close()
