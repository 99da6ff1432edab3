"""QueryRoute: the topic's queues on this one broker, as the proxy describes them.

Why the gRPC address and not the broker port: in RocketMQ 5 the client talks to the proxy only, so the
route's ``Broker.endpoints`` are the endpoint the client already uses (``RouteActivity`` with the
proxy in local mode), and ``accept_message_types`` come from the topic's ``message.type``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..topics import PERM_READ, PERM_WRITE
from .producer import accepted_types, validate_topic
from .status import ok, topic_not_found
from .stubs import pb, svc

if TYPE_CHECKING:
    from ..broker import Broker


def query_route(broker: Broker, request: Any, host: str, port: int) -> Any:
    topic = request.topic.name
    validate_topic(topic)
    cfg = broker.topics.get(topic)
    if cfg is None:
        raise topic_not_found(topic)
    endpoints = pb.Endpoints(
        scheme=pb.AddressScheme.IPv4, addresses=[pb.Address(host=host, port=port)]
    )
    proto_broker = pb.Broker(name=broker.broker_name, id=0, endpoints=endpoints)
    types = accepted_types(cfg)
    readable, writable = bool(cfg.perm & PERM_READ), bool(cfg.perm & PERM_WRITE)
    # genMessageQueueFromQueueData: read-only, write-only, read-write, then no-permission queues
    r = w = rw = n = 0
    if readable and writable:
        rw = min(cfg.write_queue_nums, cfg.read_queue_nums)
        r = cfg.read_queue_nums - rw
        w = cfg.write_queue_nums - rw
    elif writable:
        w = cfg.write_queue_nums
    elif readable:
        r = cfg.read_queue_nums
    else:
        n = max(1, cfg.write_queue_nums, cfg.read_queue_nums)
    response = svc.QueryRouteResponse(status=ok())
    queue_id = 0
    for count, permission in (
        (r, pb.Permission.READ),
        (w, pb.Permission.WRITE),
        (rw, pb.Permission.READ_WRITE),
        (n, pb.Permission.NONE),
    ):
        for _ in range(count):
            response.message_queues.add(
                topic=request.topic,
                id=queue_id,
                permission=permission,
                broker=proto_broker,
                accept_message_types=types,
            )
            queue_id += 1
    return response
