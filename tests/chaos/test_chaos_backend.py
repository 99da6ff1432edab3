"""``txmsg chaos --backend``: what rocketmq5 takes and what it refuses, before anything starts.

The embedded broker's gRPC endpoint serves one broker and the fault proxy relays remoting ports,
so ``--brokers 2`` and ``--faults network`` are refused with the reason instead of running a chaos
run that would not test what it claims to.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.chaos.cli import chaos_command
from benchmarks.chaos.roles import _client_config
from benchmarks.chaos.run import ChaosRun, RunOptions, backend_problem
from benchmarks.chaos.settings import ChaosSettings


@pytest.mark.parametrize(
    ("backend", "brokers", "faults", "problem"),
    [
        ("rocketmq", 2, ("kill", "network"), None),
        ("rocketmq5", 1, ("kill",), None),
        ("rocketmq5", 2, ("kill",), "--brokers 1"),
        ("rocketmq5", 1, ("kill", "network"), "--faults kill only"),
        ("kafka", 1, ("kill",), "use one of rocketmq, rocketmq5"),
    ],
)
def test_backend_problem(
    backend: str, brokers: int, faults: tuple[str, ...], problem: str | None
) -> None:
    found = backend_problem(backend, brokers, faults)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


@pytest.mark.parametrize("extra", [["--brokers", "2"], ["--faults", "network"]])
def test_cli_refuses_before_starting_anything(tmp_path: Path, extra: list[str]) -> None:
    workdir = tmp_path / "chaos"
    result = CliRunner().invoke(
        chaos_command, ["--backend", "rocketmq5", "--workdir", str(workdir), *extra]
    )
    assert result.exit_code == 2, result.output
    assert "--backend rocketmq5" in result.output
    assert not workdir.exists()


def test_run_refuses_too(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--brokers 1"):
        ChaosRun(ChaosSettings(workdir=tmp_path), RunOptions(backend="rocketmq5", brokers=2))


def test_processes_use_the_backend_and_endpoint_of_the_settings(tmp_path: Path) -> None:
    five = ChaosSettings(
        workdir=tmp_path,
        backend="rocketmq5",
        name_server="127.0.0.1:9876",
        endpoints="127.0.0.1:8181",
    )
    config = _client_config(five, "p", {})
    assert config.backend == "rocketmq5"
    assert config.endpoints == "127.0.0.1:8181"
    remoting = _client_config(five.model_copy(update={"backend": "rocketmq"}), "p", {})
    assert remoting.backend == "rocketmq"
    assert remoting.name_server == "127.0.0.1:9876"


def test_check_max_is_refused_with_an_external_cluster(tmp_path: Path) -> None:
    """``--check-max`` sets the embedded broker's transactionCheckMax; a real cluster keeps its own."""
    workdir = tmp_path / "chaos"
    result = CliRunner().invoke(
        chaos_command,
        ["--name-server", "127.0.0.1:1", "--check-max", "5", "--workdir", str(workdir)],
    )
    assert result.exit_code == 2, result.output
    assert "--check-max" in result.output
    assert "transactionCheckMax" in result.output
    assert not workdir.exists()


def test_check_max_reaches_the_embedded_broker(tmp_path: Path) -> None:
    run = ChaosRun(ChaosSettings(workdir=tmp_path), RunOptions(check_max=7))
    assert run.broker_settings["check_max"] == 7
    assert ChaosRun(ChaosSettings(workdir=tmp_path), RunOptions()).broker_settings["check_max"] == 3
