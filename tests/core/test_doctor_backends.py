"""`txmsg doctor` checks whichever backend is configured (issue 14): the rocketmq5 checks (client,
endpoints) with ``backend = "rocketmq5"``, the rocketmq checks (librocketmq, name server) with
``rocketmq``; checks not named like a backend run with both; the backends' client packages are
listed as optional extras."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from txmsg.cli import main
from txmsg.doctor import check_entry_points, versions


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.chdir(tmp_path)
    for name in ("TXMSG_CONFIG", "TXMSG_NAME_SERVER", "TXMSG_BACKEND", "TXMSG_ENDPOINTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROCKETMQ_CLIENT_LOG_DIR", str(tmp_path / "client-logs"))
    return CliRunner()


def test_check_selection_follows_the_backend() -> None:
    five = [ep.name for ep in check_entry_points("rocketmq5")]
    four = [ep.name for ep in check_entry_points("rocketmq")]
    assert "rocketmq5" in five
    assert "rocketmq" not in five
    assert "rocketmq" in four
    assert "rocketmq5" not in four
    assert "rocketmq-packages" in five
    assert "rocketmq-packages" in four


def test_doctor_on_rocketmq5_checks_the_endpoints_not_librocketmq(runner: CliRunner) -> None:
    env = {"TXMSG_BACKEND": "rocketmq5", "TXMSG_ENDPOINTS": "127.0.0.1:1"}
    result = runner.invoke(main, ["doctor"], env=env)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "rocketmq5 checks" in out
    assert "endpoint 127.0.0.1:1 answers gRPC" in out
    assert "RocketMQ 5 client imports" in out
    assert "name server reachable" not in out
    assert "librocketmq" not in out
    strict = runner.invoke(main, ["doctor", "--strict"], env=env)
    assert strict.exit_code == 1  # nothing listens on port 1


def test_doctor_on_rocketmq_checks_librocketmq_not_the_endpoints(
    runner: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / "txmsg.toml").write_text('backend = "rocketmq"\nname_server = "127.0.0.1:1"\n')
    result = runner.invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "rocketmq checks" in result.output
    assert "name server reachable" in result.output
    assert "rocketmq5 checks" not in result.output
    assert "answers gRPC" not in result.output


def test_backend_clients_are_listed_as_optional() -> None:
    rows = {label: (detail, ok) for label, detail, ok in versions()}
    for label in (
        "rocketmq-client-python (backend rocketmq)",
        "rocketmq-python-client (backend rocketmq5)",
    ):
        assert label in rows, sorted(rows)
        assert rows[label][1] is True
