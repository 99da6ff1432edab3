"""`txmsg doctor` through the real CLI entry (click's CliRunner)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from txmsg.cli import main


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
    result = runner.invoke(main, ["doctor", "--config", str(config)], env={"TXMSG_SEND_TIMEOUT_MS": "1234"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "rocketmq-client-python" in out and "pydantic" in out
    assert "config file" in out and str(config) in out
    assert "'order-tx'  [file" in out and "1234  [TXMSG_SEND_TIMEOUT_MS]" in out
    assert "backend rocketmq" in out and "txmsg_rocketmq.backend:RocketMQBackend" in out
    assert "name server reachable" in out  # the backend's own hook ran (and found no server)


def test_doctor_strict_fails_on_a_backend_check(runner: CliRunner) -> None:
    result = runner.invoke(main, ["doctor", "--strict"], env={"TXMSG_NAME_SERVER": "127.0.0.1:1"})
    assert result.exit_code == 1 and "FAIL" in result.output


def test_doctor_names_a_bad_key(runner: CliRunner) -> None:
    result = runner.invoke(main, ["doctor"], env={"TXMSG_SEND_TIMEOUT_MS": "-5"})
    assert result.exit_code == 1
    assert "send_timeout_ms" in result.output and "TXMSG_SEND_TIMEOUT_MS" in result.output


def test_help_texts(runner: CliRunner) -> None:
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0 and "doctor" in top.output
    sub = runner.invoke(main, ["doctor", "--help"])
    assert sub.exit_code == 0 and "--config" in sub.output and "--strict" in sub.output
