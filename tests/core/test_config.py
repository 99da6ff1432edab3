"""Configuration: TOML file + TXMSG_* environment, typed; mistakes name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from txmsg import ConfigError, ExecutorConfig, RejectionPolicy, TxMsgConfig, load_config
from txmsg.config import resolve_config


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "txmsg.toml"
    path.write_text(
        'name_server = "10.0.0.1:9876"\n'
        "send_timeout_ms = 5000\n"
        "[producer]\n"
        'group = "order-tx"\n'
        '[listeners."order-tx"]\n'
        "concurrency = 32\n"
        'rejection = "abort"\n'
    )
    return path


def test_defaults_without_file_or_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(env={})
    assert config == TxMsgConfig()
    assert (config.name_server, config.backend, config.send_timeout_ms) == (
        "127.0.0.1:9876",
        "rocketmq",
        3000,
    )


def test_file_values_are_typed(toml: Path) -> None:
    config = load_config(toml, env={})
    assert config.name_server == "10.0.0.1:9876"
    assert config.send_timeout_ms == 5000
    assert config.producer.group == "order-tx"
    settings = config.listener_settings("order-tx")
    assert settings is not None
    assert settings.rejection is RejectionPolicy.ABORT
    merged = settings.apply(ExecutorConfig(concurrency=4, queue_capacity=9))
    assert merged == ExecutorConfig(
        concurrency=32, queue_capacity=9, rejection=RejectionPolicy.ABORT
    )


def test_env_overrides_file_and_is_reported(toml: Path) -> None:
    env = {
        "TXMSG_NAME_SERVER": "10.9.9.9:9876",
        "TXMSG_PRODUCER__GROUP": "pay-tx",
        "TXMSG_LISTENERS__ORDER_TX__QUEUE_CAPACITY": "8",
        "TXMSG_SEND_TIMEOUT_MS": "1500",
    }
    config, sources = resolve_config(toml, env)
    assert config.name_server == "10.9.9.9:9876"
    assert config.send_timeout_ms == 1500
    assert config.producer.group == "pay-tx"
    settings = config.listener_settings("order-tx")  # '-' in the group matches '_' in env
    assert settings is not None
    # the file's and the env's settings for the group are merged
    assert (settings.queue_capacity, settings.concurrency) == (8, 32)
    assert list(config.listeners) == ["order-tx"]
    assert sources.keys["name_server"] == "TXMSG_NAME_SERVER"
    assert sources.keys["producer.group"] == "TXMSG_PRODUCER__GROUP"
    assert sources.file == toml


def test_config_file_from_env_variable(toml: Path) -> None:
    assert load_config(env={"TXMSG_CONFIG": str(toml)}).producer.group == "order-tx"


def test_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('name_sever = "x:1"\n')
    with pytest.raises(
        ConfigError, match=r"unknown config key 'name_sever'.*did you mean 'name_server'"
    ) as info:
        load_config(path, env={})
    assert info.value.key == "name_sever"


def test_unknown_nested_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[listeners.pay]\nconcurency = 3\n")
    with pytest.raises(
        ConfigError, match=r"'listeners.pay.concurency'.*did you mean 'concurrency'"
    ):
        load_config(path, env={})


def test_bad_value_names_key_and_source(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"bad value for config key 'send_timeout_ms' \(from TXMSG_SEND_TIMEOUT_MS\)",
    ) as info:
        load_config(env={"TXMSG_SEND_TIMEOUT_MS": "soon"})
    assert info.value.key == "send_timeout_ms"
    path = tmp_path / "c.toml"
    path.write_text('[listeners.pay]\nrejection = "drop"\n')
    with pytest.raises(ConfigError, match=r"'listeners.pay.rejection' \(from file .*c.toml\)"):
        load_config(path, env={})


def test_env_typo_is_an_error_but_tooling_variables_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"TXMSG_NAMESERVER .*did you mean TXMSG_NAME_SERVER"):
        load_config(env={"TXMSG_NAMESERVER": "x:1"})
    config = load_config(env={"TXMSG_ARTIFACTS": "/tmp/a", "TXMSG_TEST_PG_URL": "postgresql://"})
    assert config == TxMsgConfig()


def test_env_unknown_key_inside_a_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"'producer\.grup'.*TXMSG_PRODUCER__GRUP.*did you mean 'group'"
    ):
        load_config(env={"TXMSG_PRODUCER__GRUP": "x"})
    with pytest.raises(ConfigError, match="TXMSG_LISTENERS__<GROUP>__<KEY>"):
        load_config(env={"TXMSG_LISTENERS__MAX_POOL_SIZE": "3"})


def test_broken_or_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name_server = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})


# --- name server addresses (issue 12 point 5) ------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        "garbage",
        "10.0.0.1",
        "10.0.0.1:",
        ":9876",
        "host:0",
        "host:65536",
        "host:98760",
        "host:x",
        "a:1;",
        "a:1;;b:2",
        "bad host:1",
        "host:\u0663",
    ],
)
def test_a_malformed_name_server_is_refused_with_the_expected_form(value: str) -> None:
    with pytest.raises(
        ConfigError, match=r"name_server.*TXMSG_NAME_SERVER.*expected host:port\[;host:port\]"
    ) as info:
        load_config(env={"TXMSG_NAME_SERVER": value})
    assert info.value.key == "name_server"
    assert "1..65535" in str(info.value)


def test_a_malformed_name_server_in_the_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "txmsg.toml"
    path.write_text('name_server = "garbage"\n')
    with pytest.raises(ConfigError, match="'garbage' is not host:port; expected host:port") as info:
        load_config(path, env={})
    assert f"from file {path}" in str(info.value)


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("10.0.0.1:9876", "10.0.0.1:9876"),
        ("ns1:1;ns2:65535", "ns1:1;ns2:65535"),
        (" ns1:9876 ; ns2:9877 ", "ns1:9876;ns2:9877"),
        ("[::1]:9876", "[::1]:9876"),
    ],
)
def test_well_formed_name_servers_are_accepted(value: str, kept: str) -> None:
    assert load_config(env={"TXMSG_NAME_SERVER": value}).name_server == kept
    assert TxMsgConfig(name_server=value).name_server == kept
