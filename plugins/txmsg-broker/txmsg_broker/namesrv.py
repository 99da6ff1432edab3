"""Name server: route queries (105) and cluster info (106), answered from the broker's own topic table.

Broker registration is internal (same process), so a topic the broker creates is in the routes at
once - as in Apache RocketMQ 4.9.8, whose broker calls ``registerBrokerAll`` right after
``TopicConfigManager.createTopicInSendMessageMethod`` / ``createTopicInSendMessageBackMethod``
created a topic.  A route query never creates anything, as in 4.9.8 (``RouteInfoManager
.pickupTopicRouteData``): a topic nobody created (by a send with auto-create on, an admin command,
or - ``%RETRY%<group>`` - a consumer's heartbeat) is answered TOPIC_NOT_EXIST (17) with the real
remark.  ``TBW102`` has a route only with auto-create on: that route is what a producer falls back
to for a topic without one (librocketmq uses min(4, its queues) of it), and its first send then
creates the topic.  Consequences a real cluster has too: a consumer subscribed to a topic that does
not exist yet has no queues for it and sends its heartbeat to no broker; it learns the route at its
next route refresh (librocketmq: 3 s after its start, then every 30 s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import fastjson
from .codec import GET_BROKER_CLUSTER_INFO, GET_ROUTEINFO_BY_TOPIC, TOPIC_NOT_EXIST, RemotingCommand
from .topics import DEFAULT_TOPIC, SUGGEST_APPLY_TOPIC, TopicConfig, validate_topic_name
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
    return fastjson.dumps(route)


def resolve_topic(broker: Broker, topic: str) -> TopicConfig | None:
    """The topic's config if the name server has a route for it; never creates a topic."""
    if validate_topic_name(topic) is not None:
        return None
    if topic == DEFAULT_TOPIC and not broker.config.auto_create_topics:
        return None  # 4.9.8 creates TBW102 only with autoCreateTopicEnable
    return broker.topics.get(topic)


def topic_not_exist_remark(topic: str) -> str:
    """4.9.8's remark, word for word (``DefaultRequestProcessor.getRouteInfoByTopic`` + FAQUrl)."""
    return f"No topic route info in name server for the topic: {topic}{SUGGEST_APPLY_TOPIC}"


def install(broker: Broker) -> None:
    async def get_route(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        topic = cmd.ext("topic")
        cfg = resolve_topic(broker, topic)
        if cfg is None:
            return cmd.error(TOPIC_NOT_EXIST, topic_not_exist_remark(topic))
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
        return cmd.response(body=fastjson.dumps(body))

    server = broker.namesrv_server
    if server is None:  # external name servers (several brokers: nameserver.py) route this broker
        return
    server.register(GET_ROUTEINFO_BY_TOPIC, get_route, inline=True)
    server.register(GET_BROKER_CLUSTER_INFO, get_cluster_info, inline=True)
