"""Name server: route queries (105) and cluster info (106), answered from the broker's own topic table.

Broker registration is internal (same process), so routes are always current. Differences from Java,
on purpose: with auto-create on, an unknown business topic is created on its first route query (a
push consumer that starts before the first send would otherwise wait 30 s for its next route refresh),
and ``%RETRY%<group>`` topics are created on query in every mode (the consumer asks for them before
its first heartbeat; without a route retries are never consumed).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .codec import GET_BROKER_CLUSTER_INFO, GET_ROUTEINFO_BY_TOPIC, TOPIC_NOT_EXIST, RemotingCommand
from .topics import DEFAULT_TOPIC, RETRY_PREFIX, TopicConfig, validate_topic_name
from .transport import Connection

if TYPE_CHECKING:
    from .broker import Broker


def route_body(broker: Broker, cfg: TopicConfig) -> bytes:
    route: dict[str, object] = {
        "orderTopicConf": None,
        "queueDatas": [
            {
                "brokerName": broker.broker_name,
                "readQueueNums": cfg.read_queue_nums,
                "writeQueueNums": cfg.write_queue_nums,
                "perm": cfg.perm,
                "topicSysFlag": cfg.topic_sys_flag,
            }
        ],
        "brokerDatas": [
            {
                "cluster": broker.config.cluster_name,
                "brokerName": broker.broker_name,
                "brokerAddrs": {"0": broker.broker_addr},
            }
        ],
        "filterServerTable": {},
    }
    return json.dumps(route, separators=(",", ":")).encode()


def resolve_topic(broker: Broker, topic: str) -> TopicConfig | None:
    """The topic's config if the name server should publish a route for it (may auto-create)."""
    if validate_topic_name(topic) is not None:
        return None
    if topic == DEFAULT_TOPIC and not broker.config.auto_create_topics:
        return None
    cfg = broker.topics.get(topic)
    if cfg is not None:
        return cfg
    if topic.startswith(RETRY_PREFIX):
        cfg, _ = broker.topics.create_if_absent(topic, 1)
        broker.logs.broker.info("HeartbeatThread_1", f"create new topic {cfg.describe()}")
        return cfg
    if broker.config.auto_create_topics and not topic.startswith("%"):
        cfg, created = broker.topics.create_if_absent(topic)
        if created:
            broker.logs.broker.info(
                "SendMessageThread_1",
                f"Create new topic by default topic:[{DEFAULT_TOPIC}] config:[{cfg.describe()}] "
                f"producer:[{broker.namesrv_addr}]",
            )
        return cfg
    return None


def install(broker: Broker) -> None:
    async def get_route(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = cmd.ext("topic")
        cfg = resolve_topic(broker, topic)
        if cfg is None:
            return cmd.error(
                TOPIC_NOT_EXIST,
                f"No topic route info in name server for the topic: {topic}\n"
                "See http://rocketmq.apache.org/docs/faq/ for further details. "
                "Create it with `txmsg topic create NAME` or start the broker with --auto-create-topics.",
            )
        return cmd.response(body=route_body(broker, cfg))

    async def get_cluster_info(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        body = {
            "brokerAddrTable": {
                broker.broker_name: {
                    "cluster": broker.config.cluster_name,
                    "brokerName": broker.broker_name,
                    "brokerAddrs": {"0": broker.broker_addr},
                }
            },
            "clusterAddrTable": {broker.config.cluster_name: [broker.broker_name]},
        }
        return cmd.response(body=json.dumps(body, separators=(",", ":")).encode())

    broker.namesrv_server.register(GET_ROUTEINFO_BY_TOPIC, get_route, inline=True)
    broker.namesrv_server.register(GET_BROKER_CLUSTER_INFO, get_cluster_info, inline=True)
