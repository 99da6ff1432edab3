"""The announcer's route logic (issue 12.2): which topics the start-up announcement subscribes to,
re-announcing when a route gains a broker, and the name-server query it relies on."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from txmsg_broker import codec, fastjson
from txmsg_broker.rawclient import call
from txmsg_rocketmq import announce as announce_mod
from txmsg_rocketmq.announce import Announcer
from txmsg_rocketmq.gate import Gate
from txmsg_rocketmq.routes import DEFAULT_TOPIC, Route, _masters, query_route


class FakeRoutes:
    """topic -> master addresses, as a name server would answer."""

    def __init__(self, **routes: set[str]) -> None:
        self.routes = {k: frozenset(v) for k, v in routes.items()}

    def __call__(self, name_server: str, topic: str, **_: Any) -> Route:
        return Route(topic, self.routes.get(topic, frozenset()))


def make_announcer(
    monkeypatch: pytest.MonkeyPatch, routes: FakeRoutes
) -> tuple[Announcer, list[Any]]:
    monkeypatch.setattr(announce_mod, "query_route", routes)
    announcer = Announcer(native=None, name_server="ns:9876", watch_interval=3600)  # type: ignore[arg-type]
    calls: list[Any] = []
    monkeypatch.setattr(
        announcer,
        "_via_consumer",
        lambda inst, topics: calls.append((inst.name, list(topics))) or True,
    )
    return announcer, calls


def instance(name: str) -> Any:
    return SimpleNamespace(name=name, group="pg", gate=Gate(), announced=False, shut_down=False)


def test_start_up_announcement_uses_the_route_the_first_send_will_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    routes = FakeRoutes(existing={"b1:10911"}, TBW102={"b1:10911", "b2:10911"})
    announcer, calls = make_announcer(monkeypatch, routes)
    assert announcer.route_topics(["existing", "missing", "missing2"]) == [
        "existing",
        DEFAULT_TOPIC,
    ]
    routes.routes.pop(DEFAULT_TOPIC)  # autoCreateTopicEnable=false: no fallback route
    assert announcer.route_topics(["missing"]) == []
    inst = instance("i0")
    assert announcer.announce_now(inst, ["existing"]) is True
    assert calls == [("i0", ["existing"])]
    announcer.stop()


def test_a_broker_joining_a_route_announces_the_instances_using_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    routes = FakeRoutes(orders={"b1:10911"}, TBW102={"b1:10911"})
    announcer, calls = make_announcer(monkeypatch, routes)
    a, b, gone = instance("a"), instance("b"), instance("gone")
    announcer.announce_now(a, ["orders"])
    announcer.announce_now(b, ["fresh"])  # no route yet: announced through TBW102
    announcer.announce_now(gone, ["orders"])
    gone.shut_down = True
    calls.clear()
    assert announcer.check_routes() == 0  # nothing changed
    routes.routes["orders"] = frozenset({"b1:10911", "b2:10911"})  # broker-b joins orders
    assert announcer.check_routes() == 1
    assert calls == [("a", ["orders"])]
    calls.clear()
    routes.routes["TBW102"] = frozenset({"b1:10911", "b2:10911"})  # ... and the auto-create route
    assert announcer.check_routes() == 1
    assert calls == [("b", [DEFAULT_TOPIC])]
    calls.clear()
    routes.routes["fresh"] = frozenset({"b2:10911"})  # created by its first send: a TBW102 broker
    assert announcer.check_routes() == 0
    a.gate.begin_close()  # a closing instance is not announced
    routes.routes["orders"] = frozenset({"b3:10911"})
    assert announcer.check_routes() == 0
    announcer.stop()


def test_route_query_against_the_embedded_broker(txmsg_broker: Any) -> None:
    ns = txmsg_broker.namesrv_addr
    assert query_route(ns, "NoSuchTopicYet").masters == frozenset()
    assert query_route(ns, DEFAULT_TOPIC).masters == {txmsg_broker.broker_addr}
    assert query_route(f"127.0.0.1:1;{ns}", DEFAULT_TOPIC).masters == {txmsg_broker.broker_addr}
    direct = fastjson.loads(call(ns, codec.GET_ROUTEINFO_BY_TOPIC, {"topic": DEFAULT_TOPIC}).body)
    assert direct["brokerDatas"][0]["brokerAddrs"]["0"] == txmsg_broker.broker_addr


def test_fastjson_bare_numeric_keys_are_understood() -> None:
    """What a real 4.9.8 name server sends to old clients: ``{0:"host:port"}``."""
    body = (
        b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:20911",1:"127.0.0.1:20921"},"brokerName":"broker-a",'
        b'"cluster":"DefaultCluster"},{"brokerAddrs":{0:"127.0.0.1:30911"},"brokerName":"broker-r",'
        b'"cluster":"DefaultCluster"}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,'
        b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4},{"brokerName":"broker-r","perm":4,'
        b'"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
    )
    assert _masters(body) == {"127.0.0.1:20911"}  # broker-r is read-only: sends never go there
