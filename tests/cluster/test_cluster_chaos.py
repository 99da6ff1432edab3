"""The chaos run with ``--brokers 2`` (issue 12.3): each broker is its own monkey victim."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner
from txmsg_broker.testing import wait_until

from benchmarks.chaos.cli import chaos_command
from benchmarks.chaos.run import ChaosRun, RunOptions
from benchmarks.chaos.settings import ChaosSettings


def test_each_broker_is_a_child_the_monkey_kills_alone(tmp_path: Path) -> None:
    run = ChaosRun(ChaosSettings(workdir=tmp_path), RunOptions(brokers=2))
    name_server = run._start_brokers(tmp_path)
    try:
        a, b = run.brokers
        assert (a.name, b.name, a.kind, b.kind) == ("broker-a", "broker-b", "broker", "broker")
        assert run.cluster is not None
        assert name_server == run.cluster.namesrv_addr
        port = b.process.broker_port
        b.kill()
        assert a.alive
        assert not b.alive
        assert b.kills == 1
        b.start()
        wait_until(lambda: b.alive, timeout=30, message="broker-b back")
        assert b.process.broker_port == port
        assert b.starts == 1
    finally:
        for child in run.brokers:
            child.stop(15.0)
        assert run.cluster is not None
        run.cluster.stop(15.0)


def test_the_chaos_command_takes_brokers() -> None:
    result = CliRunner().invoke(chaos_command, ["--help"])
    assert "--brokers" in result.output
