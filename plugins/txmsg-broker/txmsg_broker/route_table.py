"""The route table of a stand-alone name server: what brokers registered, answered as routes.

Modelled on Apache RocketMQ 4.9.8's ``RouteInfoManager`` so clients see what a real cluster of
several brokers shows them:

* a broker registers (REGISTER_BROKER, 103) at start, every ``registerNameServerPeriod`` (30 s) and
  right after it created or changed a topic; the registration carries its whole topic table;
* a topic's route lists one queue-data entry per broker that has the topic, and those brokers'
  addresses; a topic no registered broker has is TOPIC_NOT_EXIST (a route query creates nothing);
* a broker leaves the routes when its connection to the name server closes (``onChannelDestroy``:
  a ``kill -9`` of the broker closes it at once), when it unregisters (UNREGISTER_BROKER, 104, on a
  clean shutdown), or when it has not registered for 120 s (``scanNotActiveBroker``).

One difference, on purpose: a registration replaces the broker's topic set (4.9.8 only adds and
updates, and forgets a topic only through ``deleteTopic``); our brokers never delete topics, so the
results are the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from . import fastjson

#: 4.9.8 ``RouteInfoManager.BROKER_CHANNEL_EXPIRED_TIME``
BROKER_EXPIRED_MS = 120_000


@dataclass(frozen=True)
class QueueData:
    """One broker's share of a topic (4.9.8 ``QueueData``)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
        }


@dataclass
class BrokerEntry:
    """A registered master: where it is, what it serves, when it last registered, its channel."""

    cluster: str
    broker_name: str
    broker_addr: str
    topics: dict[str, QueueData] = field(default_factory=dict)
    last_update_ms: float = 0.0
    channel: object | None = None


def topics_from_wrapper(broker_name: str, wrapper: dict[str, Any]) -> dict[str, QueueData]:
    """``topicConfigSerializeWrapper.topicConfigTable`` of a registration body → queue data."""
    table = wrapper.get("topicConfigTable") or {}
    out: dict[str, QueueData] = {}
    for name, cfg in table.items():
        if not isinstance(cfg, dict):
            continue
        out[str(name)] = QueueData(
            broker_name,
            int(cfg.get("readQueueNums", 0)),
            int(cfg.get("writeQueueNums", 0)),
            int(cfg.get("perm", 6)),
            int(cfg.get("topicSysFlag", 0)),
        )
    return out


class RouteTable:
    """Brokers by name (masters only: brokerId 0); not thread-safe - the name server's loop owns it."""

    def __init__(self, *, expired_ms: int = BROKER_EXPIRED_MS) -> None:
        self.expired_ms = expired_ms
        self.brokers: dict[str, BrokerEntry] = {}

    def register(
        self,
        cluster: str,
        broker_name: str,
        broker_addr: str,
        topics: dict[str, QueueData],
        channel: object | None = None,
        now_ms: float | None = None,
    ) -> bool:
        """Record a registration; True when this broker (name at this address) is new."""
        now = time.time() * 1000 if now_ms is None else now_ms
        previous = self.brokers.get(broker_name)
        new = previous is None or previous.broker_addr != broker_addr
        self.brokers[broker_name] = BrokerEntry(
            cluster, broker_name, broker_addr, topics, now, channel
        )
        return new

    def unregister(self, broker_name: str, broker_addr: str) -> BrokerEntry | None:
        entry = self.brokers.get(broker_name)
        if entry is None or entry.broker_addr != broker_addr:
            return None
        return self.brokers.pop(broker_name)

    def remove_channel(self, channel: object) -> list[BrokerEntry]:
        """The brokers that registered over ``channel`` (now closed), removed."""
        gone = [e for e in self.brokers.values() if e.channel is channel]
        for entry in gone:
            del self.brokers[entry.broker_name]
        return gone

    def expire(self, now_ms: float | None = None) -> list[BrokerEntry]:
        """Brokers silent for longer than ``expired_ms``, removed."""
        now = time.time() * 1000 if now_ms is None else now_ms
        gone = [e for e in self.brokers.values() if now - e.last_update_ms > self.expired_ms]
        for entry in gone:
            del self.brokers[entry.broker_name]
        return gone

    def route(self, topic: str) -> dict[str, Any] | None:
        """4.9.8 ``pickupTopicRouteData``: None when no registered broker has ``topic``."""
        holders = sorted(
            (e for e in self.brokers.values() if topic in e.topics), key=lambda e: e.broker_name
        )
        if not holders:
            return None
        return {
            "orderTopicConf": None,
            "queueDatas": [e.topics[topic].to_json() for e in holders],
            "brokerDatas": [
                {
                    "cluster": e.cluster,
                    "brokerName": e.broker_name,
                    "brokerAddrs": {"0": e.broker_addr},
                }
                for e in holders
            ],
            "filterServerTable": {},
        }

    def route_body(self, topic: str) -> bytes | None:
        route = self.route(topic)
        return None if route is None else fastjson.dumps(route)

    def cluster_info(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_INFO's body: every master, and the brokers of every cluster."""
        entries = sorted(self.brokers.values(), key=lambda e: e.broker_name)
        clusters: dict[str, list[str]] = {}
        for e in entries:
            clusters.setdefault(e.cluster, []).append(e.broker_name)
        return {
            "brokerAddrTable": {
                e.broker_name: {
                    "cluster": e.cluster,
                    "brokerName": e.broker_name,
                    "brokerAddrs": {"0": e.broker_addr},
                }
                for e in entries
            },
            "clusterAddrTable": clusters,
        }
