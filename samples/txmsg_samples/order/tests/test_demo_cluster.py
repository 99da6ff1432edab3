"""``txmsg demo`` against a cluster it did not start: ``--name-server``, ``TXMSG_NAME_SERVER``, a
cluster that refuses to create topics, a name server that is not there, a malformed address."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from txmsg_broker.app import EmbeddedBroker
from txmsg_broker.codec import NO_PERMISSION, UPDATE_AND_CREATE_TOPIC
from txmsg_broker.testing import Clients, create_topic
from txmsg_broker.topics import TopicConfig

from txmsg_samples.order.cluster import ensure_topics
from txmsg_samples.order.demo import DemoOptions, _where_line, demo, target
from txmsg_samples.order.demo_run import DEMO_NAMES
from txmsg_samples.order.events import OrderPaid

SMALL = ["--orders", "16", "--threads", "4", "--seed", "5", "--timeout", "90"]
SMALL += ["--fail-rate", "0.2", "--slow-rate", "0.2", "--lose-ack-rate", "0.2"]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No txmsg.toml in the working directory and no TXMSG_* configuration from outside."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TXMSG_CONFIG", raising=False)
    monkeypatch.delenv("TXMSG_NAME_SERVER", raising=False)
    return tmp_path


@pytest.fixture
def cluster(txmsg_broker_factory: Any) -> Any:
    """A separately started embedded broker; check_max 30 as the demo's own (slow local
    transactions outlive a few checks), consumer retries after ~0.1 s."""
    pytest.importorskip("txmsg_rocketmq.backend")
    return txmsg_broker_factory(check_max=30, delay_scale=0.01)


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(demo, args, env=env, catch_exceptions=False)


def first_line(result: Result) -> str:
    return result.output.splitlines()[0]


def leave_earlier_messages(name_server: str) -> int:
    """What an interrupted earlier run leaves on the demo topic: events nobody consumed (and
    one that is not an OrderPaid at all).  Sent while the topic is still untyped (a plain
    producer may not send to a TRANSACTION topic); the demo then makes it TRANSACTION."""
    # the remoting client loads librocketmq: optional, skipped by the cluster fixture without it
    from rocketmq.client import Message  # noqa: PLC0415

    create_topic(name_server, DEMO_NAMES.topic)
    bodies = [OrderPaid(f"order-earlier-{i:05d}", "user-0000", 500).to_json() for i in range(3)]
    with Clients(name_server) as clients:
        producer = clients.producer()
        for body in [*bodies, b"not json"]:
            msg = Message(DEMO_TOPIC)
            msg.set_body(body)
            producer.send_sync(msg)
    return len(bodies) + 1


DEMO_TOPIC = DEMO_NAMES.topic


@pytest.mark.slow
def test_name_server_option_runs_against_that_cluster(cluster: Any, clean_env: Path) -> None:
    earlier = leave_earlier_messages(cluster.namesrv_addr)
    result = invoke(["--name-server", cluster.namesrv_addr, *SMALL, "--workdir", "w1"])
    assert result.exit_code == 0, result.output
    assert first_line(result).startswith(
        f"txmsg demo against your cluster at {cluster.namesrv_addr} (from --name-server)"
    )
    assert f"topic {DEMO_TOPIC}: created/updated" in result.output
    assert "CONSISTENT" in result.output
    assert "INCONSISTENT" not in result.output
    # the consumer groups skipped the earlier messages instead of counting them (all of them
    # by the time the run settles, unless a queue held no message of this run)
    skipped = re.search(r"messages of other runs skipped\W+(\d+)", result.output)
    assert skipped is not None, result.output
    assert 1 <= int(skipped[1]) <= 3 * earlier, result.output
    assert not (clean_env / "w1" / "broker").exists()  # no broker of its own

    # a second run on the same cluster goes on from the groups' offsets
    again = invoke(["--name-server", cluster.namesrv_addr, *SMALL, "--workdir", "w2"])
    assert again.exit_code == 0, again.output
    assert "CONSISTENT" in again.output
    assert "INCONSISTENT" not in again.output


def test_txmsg_name_server_is_honoured(cluster: Any, clean_env: Path) -> None:
    result = invoke([*SMALL], env={"TXMSG_NAME_SERVER": cluster.namesrv_addr})
    assert result.exit_code == 0, result.output
    assert first_line(result).startswith(
        f"txmsg demo against your cluster at {cluster.namesrv_addr} (from TXMSG_NAME_SERVER)"
    )
    assert "CONSISTENT" in result.output
    assert "INCONSISTENT" not in result.output


def test_txmsg_toml_is_honoured_until_it_is_wrong(clean_env: Path) -> None:
    """name_server in ./txmsg.toml selects the cluster (here one that is not there: a clear
    error before anything else), and a malformed one is the config validation message."""
    port = _free_port()
    (clean_env / "txmsg.toml").write_text(f'name_server = "127.0.0.1:{port}"\n')
    result = invoke(SMALL)
    assert result.exit_code == 1, result.output
    assert first_line(result).startswith(
        f"txmsg demo against your cluster at 127.0.0.1:{port} (from name_server in txmsg.toml)"
    )
    assert f"cannot reach 127.0.0.1:{port}" in result.output
    assert "CONSISTENT" not in result.output

    (clean_env / "txmsg.toml").write_text('name_server = "garbage"\n')
    bad = invoke(SMALL)
    assert bad.exit_code == 2, bad.output
    assert "'garbage' is not host:port; expected host:port[;host:port]" in bad.output


class RefusingCluster:
    """An embedded broker in this process whose broker refuses UPDATE_AND_CREATE_TOPIC, as a
    cluster with ACL does for an account without admin rights."""

    def __init__(self, tmp: Path) -> None:
        self.broker = EmbeddedBroker(tmp / "data", tmp / "logs").start()

        async def refuse(cmd: Any, conn: Any) -> Any:
            return cmd.error(NO_PERMISSION, "UPDATE_AND_CREATE_TOPIC needs admin rights")

        self.broker.call(lambda b: b.register(UPDATE_AND_CREATE_TOPIC, refuse, inline=True))

    def has_topic(self, topic: str) -> bool:
        return bool(self.broker.call(lambda b: b.topics.get(topic) is not None))


@pytest.fixture
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RefusingCluster]:
    cluster = RefusingCluster(tmp_path_factory.mktemp("refusing"))
    yield cluster
    cluster.broker.stop()


def test_cluster_that_refuses_topics_gets_the_commands(
    refusing: RefusingCluster, clean_env: Path
) -> None:
    addr = refusing.broker.namesrv_addr
    result = invoke(["--name-server", addr, *SMALL])
    assert result.exit_code == 1, result.output
    out = result.output
    assert "did not let the demo create its topics, and nothing has been sent" in out
    assert "refused (code 16): UPDATE_AND_CREATE_TOPIC needs admin rights" in out
    topic = DEMO_TOPIC
    assert f"mqadmin updateTopic -n {addr} -c DefaultCluster -t {topic} -r 4 -w 4" in out
    assert f"txmsg topic create {topic} --namesrv {addr} --type TRANSACTION --queues 4" in out
    assert "paying orders" not in out
    assert "CONSISTENT" not in out
    assert not refusing.has_topic(topic)


def test_refused_but_existing_topic_is_used(refusing: RefusingCluster) -> None:
    """After an operator created the topic, a refusal to update it no longer stops the demo."""
    topic = DEMO_TOPIC
    refusing.broker.call(
        lambda b: b.topics.put(TopicConfig(topic, attributes={"message.type": "TRANSACTION"}))
    )
    (line,) = ensure_topics(refusing.broker.namesrv_addr, [topic])
    assert line.startswith(f"topic {topic}: exists on every broker; used as it is")


@pytest.mark.parametrize("value", ["garbage", "host:98760", "a:1;;b:2"])
def test_malformed_name_server_option(value: str, clean_env: Path) -> None:
    result = invoke(["--name-server", value])
    assert result.exit_code == 2
    assert "Invalid value for '--name-server'" in result.output
    assert "expected host:port[;host:port]" in result.output


def test_nothing_set_starts_the_embedded_broker(clean_env: Path) -> None:
    """The built-in default name server does not count as set (the full embedded run is
    test_demo_e2e's; here only the choice and the first line)."""
    assert target(None)[:2] == (None, "")
    line = _where_line(DemoOptions(), None)
    assert line.startswith("txmsg demo on its own embedded broker (no name server set;")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
