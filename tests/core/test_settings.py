"""Issue 24: the core's configuration holds only core keys; each backend declares its settings
model (entry points ``txmsg.settings``), read from the same sources and validated through it; every
bad value is a ConfigError (never pydantic's ValidationError), with pydantic's detail."""

from __future__ import annotations

import pydantic
import pytest
from txmsg_rocketmq.backend import RocketMQBackend
from txmsg_rocketmq.settings import RocketMQSettings
from txmsg_rocketmq5.settings import RocketMQ5Settings

import txmsg.settings
from txmsg import ConfigError, ExecutorConfig, TxMsgConfig, load_config
from txmsg.config import ListenerSettings


def test_the_core_model_declares_no_backend_key() -> None:
    backend_keys = set(RocketMQSettings.model_fields) | set(RocketMQ5Settings.model_fields)
    assert not backend_keys & set(TxMsgConfig.model_fields)
    assert {"name_server", "endpoints", "tls", "max_message_size"} <= backend_keys


def test_backends_register_their_models() -> None:
    assert txmsg.settings.settings_models() == {
        "rocketmq": RocketMQSettings,
        "rocketmq5": RocketMQ5Settings,
    }


@pytest.mark.parametrize(
    ("build", "key", "detail"),
    [
        (lambda: ExecutorConfig(concurrency=0), "concurrency", "greater than or equal to 1"),
        (lambda: TxMsgConfig(name_server="garbage"), "name_server", "expected host:port"),
        (lambda: TxMsgConfig(endpoints="proxy"), "endpoints", "expected host:port"),
        (
            lambda: TxMsgConfig(listeners={"a": {"concurrency": 0}}),
            "listeners.a.concurrency",
            "greater than",
        ),
        (
            lambda: ListenerSettings(queue_capacity=-1),
            "queue_capacity",
            "greater than or equal to 0",
        ),
        (lambda: RocketMQSettings(max_message_size="big"), "max_message_size", "valid integer"),
    ],
)
def test_bad_values_raise_config_error_with_pydantic_s_detail(build, key: str, detail: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match=detail) as info:
        build()
    assert not isinstance(info.value, pydantic.ValidationError)
    assert info.value.key == key
    assert key.rsplit(".", 1)[-1] in str(info.value)


def test_max_message_size_can_be_set_and_reaches_the_rocketmq_backend() -> None:
    config = load_config(env={"TXMSG_MAX_MESSAGE_SIZE": "65536"})
    assert RocketMQSettings.of(config).max_message_size == 65536
    backend = RocketMQBackend(config, announce=False)
    try:
        assert backend.max_message_size == 65536
    finally:
        backend.close()


def test_backend_values_are_typed_from_the_environment() -> None:
    config = load_config(env={"TXMSG_TLS": "true", "TXMSG_SEND_TIMEOUT_MS": "1500"})
    assert RocketMQ5Settings.of(config).tls is True
    assert RocketMQSettings.of(config).send_timeout_ms == 1500
    assert RocketMQ5Settings.of(config).send_timeout_ms == 1500


def test_a_key_no_installed_backend_reads_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # as in an environment with only txmsg-rocketmq5 installed
    monkeypatch.setattr(txmsg.config, "settings_models", lambda: {"rocketmq5": RocketMQ5Settings})
    with pytest.raises(
        ConfigError, match=r"'pull_threads'.*no installed backend reads it.*rocketmq5"
    ):
        TxMsgConfig(pull_threads=4)
    assert (
        TxMsgConfig(endpoints="p:8081").model_extra
        == RocketMQ5Settings(endpoints="p:8081").model_dump()
    )


def test_of_reads_any_object_with_the_keys_as_attributes() -> None:
    from types import SimpleNamespace  # noqa: PLC0415 - only here

    config = SimpleNamespace(name_server="10.0.0.1:9876", endpoints="p:8081", client_log_dir=None)
    assert RocketMQSettings.of(config).name_server == "10.0.0.1:9876"
    assert RocketMQSettings.of(config).client_log_dir == RocketMQSettings().client_log_dir
    assert (
        RocketMQ5Settings.of({"endpoints": "q:8081", "client_log_dir": "x"}).endpoints == "q:8081"
    )
    # name_server is both backends' key: rocketmq5 reads the discard topic through it (issue 39)
    assert RocketMQ5Settings.of(config).name_server == "10.0.0.1:9876"
    assert RocketMQ5Settings.of({"endpoints": "q:8081"}).name_server is None
