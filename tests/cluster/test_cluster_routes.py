"""Several brokers (issue 12.3) without a client: the stand-alone name server's routes and cluster
info, ``txmsg topic create`` on every master, a topic created by a send routed to its broker only,
a ``kill -9``'d broker dropped from the routes and back after its restart, ``txmsg broker --brokers 2``."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from txmsg_broker import codec, fastjson
from txmsg_broker.cli import topic as topic_command
from txmsg_broker.cluster import next_free_port
from txmsg_broker.rawclient import call
from txmsg_broker.route_table import QueueData, RouteTable
from txmsg_broker.testing import read_log, unique, wait_until


def route(namesrv: str, topic: str) -> codec.RemotingCommand:
    return call(namesrv, codec.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})


def brokers_of(namesrv: str, topic: str) -> dict[str, str]:
    """broker name -> address in ``topic``'s route ({} when it has none)."""
    answer = route(namesrv, topic)
    if answer.code != codec.SUCCESS:
        return {}
    return {
        b["brokerName"]: b["brokerAddrs"]["0"] for b in fastjson.loads(answer.body)["brokerDatas"]
    }


def send_ext(topic: str) -> dict[str, object]:
    """SEND_MESSAGE_V2 header as librocketmq fills it (defaultTopic TBW102, 4 default queues)."""
    return {
        "a": "PG",
        "b": topic,
        "c": "TBW102",
        "d": 4,
        "e": 0,
        "f": 0,
        "g": "1",
        "h": 0,
        "i": "",
        "j": "0",
        "k": "0",
        "l": 16,
        "m": "0",
    }


def test_two_brokers_register_and_topic_create_reaches_both(txmsg_broker_factory: Any) -> None:
    cluster = txmsg_broker_factory(brokers=2)
    a, b = cluster.brokers
    assert cluster.broker_addrs == {"broker-a": a.broker_addr, "broker-b": b.broker_addr}
    info = fastjson.loads(call(cluster.namesrv_addr, codec.GET_BROKER_CLUSTER_INFO, {}).body)
    assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-a", "broker-b"]}
    assert {
        n: v["brokerAddrs"]["0"] for n, v in info["brokerAddrTable"].items()
    } == cluster.broker_addrs
    assert a.data_dir != b.data_dir
    assert a.log_dir != b.log_dir
    # the producer's fallback route spans both brokers (autoCreateTopicEnable on each)
    assert brokers_of(cluster.namesrv_addr, "TBW102") == cluster.broker_addrs

    topic = unique("TwoBrokersT")
    assert route(cluster.namesrv_addr, topic).code == codec.TOPIC_NOT_EXIST
    result = CliRunner().invoke(
        topic_command, ["create", topic, "--namesrv", cluster.namesrv_addr, "--type", "TRANSACTION"]
    )
    assert result.exit_code == 0, result.output
    assert f"create topic to {a.broker_addr} success." in result.output
    assert f"create topic to {b.broker_addr} success." in result.output
    # routed as soon as the command returns (the brokers register before answering)
    data = fastjson.loads(route(cluster.namesrv_addr, topic).body)
    assert [(q["brokerName"], q["writeQueueNums"]) for q in data["queueDatas"]] == [
        ("broker-a", 4),
        ("broker-b", 4),
    ]
    for proc in cluster.brokers:
        assert "updateAndCreateTopic called by" in read_log(proc.log_dir, "broker.log")
    assert "new broker registered" in read_log(cluster.log_dir / "namesrv", "namesrv.log")


def test_a_topic_created_by_a_send_is_routed_to_that_broker_only(txmsg_broker_factory: Any) -> None:
    cluster = txmsg_broker_factory(brokers=2)
    b = cluster.broker("broker-b")
    topic = unique("SentToB")
    assert call(b.broker_addr, codec.SEND_MESSAGE_V2, send_ext(topic), b"x").code == codec.SUCCESS
    # the broker registers right after creating it (4.9.8's oneway registerBrokerAll)
    wait_until(
        lambda: brokers_of(cluster.namesrv_addr, topic), timeout=10, message=f"a route for {topic}"
    )
    assert brokers_of(cluster.namesrv_addr, topic) == {"broker-b": b.broker_addr}


def test_a_killed_broker_leaves_the_routes_and_comes_back_on_its_port(
    txmsg_broker_factory: Any,
) -> None:
    cluster = txmsg_broker_factory(brokers=2)
    topic = unique("KillT")
    CliRunner().invoke(topic_command, ["create", topic, "--namesrv", cluster.namesrv_addr])
    b = cluster.broker("broker-b")
    port = b.broker_port
    b.kill()  # kill -9: no UNREGISTER_BROKER; the name server sees the connection close
    wait_until(
        lambda: set(brokers_of(cluster.namesrv_addr, topic)) == {"broker-a"},
        timeout=15,
        message="broker-b to leave the route",
    )
    namesrv_log = read_log(cluster.log_dir / "namesrv", "namesrv.log")
    assert (
        f"remove brokerAddr[0, {b.broker_addr}, broker-b] from brokerAddrTable, because channel destroyed"
        in namesrv_log
    )
    assert cluster.broker("broker-a").running
    b.start()
    assert b.broker_port == port
    assert brokers_of(cluster.namesrv_addr, topic) == cluster.broker_addrs  # its topics survived


def test_a_clean_stop_unregisters(txmsg_broker_factory: Any) -> None:
    cluster = txmsg_broker_factory(brokers=2)
    cluster.broker("broker-a").stop()
    assert brokers_of(cluster.namesrv_addr, "TBW102") == {
        "broker-b": cluster.broker("broker-b").broker_addr
    }
    assert "unregisterBroker, remove addr from brokerAddrTable OK" in read_log(
        cluster.log_dir / "namesrv", "namesrv.log"
    )


def test_the_route_table_forgets_closed_channels_and_silent_brokers() -> None:
    table = RouteTable(expired_ms=1000)
    ch_a, ch_b = object(), object()
    table.register("C", "broker-a", "h:1", {"t": QueueData("broker-a", 4, 4, 6)}, ch_a, now_ms=0)
    table.register("C", "broker-b", "h:2", {"t": QueueData("broker-b", 2, 2, 6)}, ch_b, now_ms=500)
    assert [q["brokerName"] for q in table.route("t")["queueDatas"]] == ["broker-a", "broker-b"]  # type: ignore[index]
    assert table.route("other") is None
    assert [e.broker_name for e in table.expire(now_ms=1200)] == ["broker-a"]
    assert [e.broker_name for e in table.remove_channel(ch_b)] == ["broker-b"]
    assert table.route("t") is None


def test_the_cli_starts_a_name_server_and_two_brokers_on_consecutive_ports(tmp_path: Path) -> None:
    base = next_free_port("127.0.0.1", 20000 + (hash(str(tmp_path)) % 20000))
    cmd = [
        sys.executable,
        "-m",
        "txmsg_broker",
        "broker",
        "--brokers",
        "2",
        "--namesrv-port",
        "0",
        "--broker-port",
        str(base),
        "--data-dir",
        str(tmp_path / "data"),
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    out = tmp_path / "out.txt"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        ready = wait_until(
            lambda: re.search(r"accepting connections: .*", out.read_text()),
            timeout=60,
            message="the ready line",
        )
        line = ready.group(0) if ready else ""
        match = re.search(
            r"namesrv (\S+) broker (\S+) brokers broker-a=(\S+),broker-b=(\S+) ", line
        )
        assert match, line
        namesrv, first, addr_a, addr_b = match.groups()
        assert first == addr_a == f"127.0.0.1:{base}"
        assert int(addr_b.rpartition(":")[2]) > base  # the next free port
        assert brokers_of(namesrv, "TBW102") == {"broker-a": addr_a, "broker-b": addr_b}
        assert (tmp_path / "data" / "broker-b").is_dir()
        assert (tmp_path / "logs" / "broker-b" / "broker.log").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert "txmsg broker stopped" in out.read_text()
