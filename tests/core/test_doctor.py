"""`txmsg doctor` through the real CLI entry (click's CliRunner)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from txmsg import doctor as doctor_module
from txmsg.cli import main
from txmsg.config import TxMsgConfig


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(tmp_path)  # no stray ./txmsg.toml
    for name in ("TXMSG_CONFIG", "TXMSG_NAME_SERVER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROCKETMQ_CLIENT_LOG_DIR", str(tmp_path / "client-logs"))
    return CliRunner()


def test_doctor_reports_versions_config_and_backends(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('name_server = "127.0.0.1:1"\n[producer]\ngroup = "order-tx"\n')
    result = runner.invoke(
        main, ["doctor", "--config", str(config)], env={"TXMSG_SEND_TIMEOUT_MS": "1234"}
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "rocketmq-client-python" in out
    assert "pydantic" in out
    assert "config file" in out
    assert str(config) in out
    assert "'order-tx'  [file" in out
    assert "1234  [TXMSG_SEND_TIMEOUT_MS]" in out
    assert "backend rocketmq" in out
    assert "txmsg_rocketmq.backend:RocketMQBackend" in out
    assert "name server reachable" in out  # the backend's own hook ran (and found no server)


def test_doctor_strict_fails_on_a_backend_check(runner: CliRunner) -> None:
    result = runner.invoke(main, ["doctor", "--strict"], env={"TXMSG_NAME_SERVER": "127.0.0.1:1"})
    assert result.exit_code == 1
    assert "FAIL" in result.output


def test_doctor_names_a_bad_key(runner: CliRunner) -> None:
    result = runner.invoke(main, ["doctor"], env={"TXMSG_SEND_TIMEOUT_MS": "-5"})
    assert result.exit_code == 1
    assert "send_timeout_ms" in result.output
    assert "TXMSG_SEND_TIMEOUT_MS" in result.output


def test_help_texts(runner: CliRunner) -> None:
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0
    assert "doctor" in top.output
    sub = runner.invoke(main, ["doctor", "--help"])
    assert sub.exit_code == 0
    assert "--config" in sub.output
    assert "--strict" in sub.output


# --- invalid configuration (issue 12 point 5) ------------------------------------------------------
@pytest.mark.parametrize("strict", [[], ["--strict"]], ids=["plain", "strict"])
def test_doctor_fails_on_a_malformed_name_server_and_shows_the_expected_form(
    runner: CliRunner, strict: list[str]
) -> None:
    result = runner.invoke(main, ["doctor", *strict], env={"TXMSG_NAME_SERVER": "garbage"})
    assert result.exit_code == 1, result.output
    assert "name_server" in result.output
    assert "TXMSG_NAME_SERVER" in result.output
    assert "expected host:port[;host:port]" in result.output
    assert "invalid literal" not in result.output
    assert "Traceback" not in result.output
    assert "name server reachable" not in result.output  # no check ran on a config that is wrong


def test_doctor_fails_on_a_bad_port_in_the_file(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('name_server = "10.0.0.1:9876;10.0.0.2:98760"\n')
    result = runner.invoke(main, ["doctor", "--config", str(config)])
    assert result.exit_code == 1
    assert "98760" in result.output
    assert "1..65535" in result.output
    assert str(config) in result.output


# --- secrets are never printed ---------------------------------------------------------------------
FAKE_KEY = "s3cr3t-Value-42"  # planted in the environment; the doctor must mask it


def test_doctor_masks_secret_and_access_key(runner: CliRunner) -> None:
    env = {
        "TXMSG_NAME_SERVER": "127.0.0.1:1",
        "TXMSG_SECRET_KEY": FAKE_KEY,
        "TXMSG_ACCESS_KEY": "AK-" + FAKE_KEY,
    }
    result = runner.invoke(main, ["doctor"], env=env)
    assert result.exit_code == 0, result.output
    assert FAKE_KEY not in result.output
    assert "secret_key" in result.output
    assert "***  [TXMSG_SECRET_KEY]" in result.output


def test_doctor_hides_a_secret_in_an_invalid_configuration(runner: CliRunner) -> None:
    # the bad name server fails the load; the secret (valid) must not show up anywhere
    env = {"TXMSG_NAME_SERVER": "garbage", "TXMSG_SECRET_KEY": FAKE_KEY}
    result = runner.invoke(main, ["doctor"], env=env)
    assert result.exit_code == 1
    assert FAKE_KEY not in result.output


def test_doctor_does_not_echo_an_invalid_secret_value(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("secret_key = 31415926535\n")  # not a string: a bad value for secret_key
    result = runner.invoke(main, ["doctor", "--config", str(config)])
    assert result.exit_code == 1
    assert "secret_key" in result.output
    assert "value hidden" in result.output
    assert "31415926535" not in result.output


def test_doctor_masks_the_password_of_a_database_url(runner: CliRunner) -> None:
    env = {
        "TXMSG_NAME_SERVER": "127.0.0.1:1",
        "TXMSG_SQLALCHEMY__URL": f"postgresql://app:{FAKE_KEY}@db:5432/orders",
    }
    result = runner.invoke(main, ["doctor"], env=env)
    assert result.exit_code == 0, result.output
    assert FAKE_KEY not in result.output
    assert "postgresql://app:***@db:5432/orders" in result.output


# --- checks are plugins (entry-point group txmsg.doctor_checks) --------------------------------------
def passing_check(config: TxMsgConfig) -> list[tuple[str, str, bool]]:
    return [("plugin check", f"saw name server {config.name_server}", True)]


def failing_check(config: TxMsgConfig) -> list[tuple[str, str, bool]]:
    return [("other backend check", "must not run: its backend is not configured", False)]


def test_doctor_runs_checks_from_entry_points(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.metadata.entry_points

    def entry_points(*, group: str) -> Any:
        if group != doctor_module.CHECKS_GROUP:
            return real(group=group)
        return [
            importlib.metadata.EntryPoint("extra", f"{__name__}:passing_check", group),
            importlib.metadata.EntryPoint("broken", "no_such_module_xyz:report", group),
            # named like a backend that is installed but not configured: skipped
            importlib.metadata.EntryPoint("other", f"{__name__}:failing_check", group),
        ]

    backends = [
        importlib.metadata.EntryPoint("other", "txmsg:TxMsg", "txmsg.backends"),
        importlib.metadata.EntryPoint("rocketmq", "txmsg:TxMsg", "txmsg.backends"),
    ]
    monkeypatch.setattr(doctor_module.importlib.metadata, "entry_points", entry_points)
    monkeypatch.setattr(doctor_module, "backend_entry_points", lambda: backends)
    result = runner.invoke(main, ["doctor"], env={"TXMSG_NAME_SERVER": "127.0.0.1:1"})
    assert result.exit_code == 0, result.output
    assert "extra checks" in result.output
    assert "saw name server 127.0.0.1:1" in result.output
    assert "no_such_module_xyz:report not importable" in result.output  # a FAIL row, advisory
    assert "must not run" not in result.output
    strict = runner.invoke(main, ["doctor", "--strict"], env={"TXMSG_NAME_SERVER": "127.0.0.1:1"})
    assert strict.exit_code == 1


def test_the_rocketmq_check_is_registered_as_an_entry_point() -> None:
    names = {
        ep.name: ep.value
        for ep in importlib.metadata.entry_points(group=doctor_module.CHECKS_GROUP)
    }
    assert names.get("rocketmq") == "txmsg_rocketmq.doctor:report"
