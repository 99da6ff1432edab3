"""RocketMQ 5: the proxy serves no system topic over gRPC, so the rescue needs the name server.

apache/rocketmq 5.3.3 ``GrpcValidator.validateTopic`` (lines 60-61) refuses every
``TopicValidator.isSystemTopic`` name with ILLEGAL_TOPIC "cannot access system topic", first thing
in ``RouteActivity.queryRoute``, ``ReceiveMessageActivity`` and ``AckMessageActivity``.  The
embedded broker's gRPC endpoint refuses it the same way while its remoting side serves the topic;
the ``rocketmq5`` backend therefore rescues through ``name_server`` (tests in test_rescue.py), and
without one the app starts without the rescue, says so, and ``txmsg doctor`` says so too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc
from txmsg_broker.testing import has_route
from txmsg_rocketmq5.doctor import rescue_row

from txmsg import TxMsg
from txmsg.rescue import DISCARD_TOPIC

from .conftest import Ledger, discard_pending, listener_class, transaction_topic

pytestmark = pytest.mark.txmsg_manual_clock

METADATA = [
    ("x-mq-language", "PYTHON"),
    ("x-mq-protocol", "GRPC_V2"),
    ("x-mq-client-version", "5.1.2"),
    ("x-mq-client-id", "rescue-limit-client"),
]


@pytest.mark.parametrize("backend_name", ["rocketmq"])
def test_the_grpc_endpoint_refuses_the_discard_topic_that_remoting_serves(
    make_app: Callable[..., TxMsg], broker: Any
) -> None:
    topic = transaction_topic(broker, "rescue-limit")
    app = make_app()
    app.add_transactional_listener(
        listener_class(Ledger()), group="rescue-limit-tx", topics=[topic], rescue_discarded=False
    )
    with app:
        app.transactional_producer("rescue-limit-tx").send_in_transaction(
            topic, {"order": 1}, arg="commit"
        )
        discard_pending(broker)
    assert has_route(broker.namesrv_addr, DISCARD_TOPIC)  # remoting: the topic is there
    with grpc.insecure_channel(broker.grpc_endpoint) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        route = stub.QueryRoute(
            svc.QueryRouteRequest(topic=pb.Resource(name=DISCARD_TOPIC)),
            metadata=METADATA,
            timeout=10,
        )
        assert route.status.code == pb.Code.ILLEGAL_TOPIC
        assert route.status.message == "cannot access system topic"
        receive = stub.ReceiveMessage(
            svc.ReceiveMessageRequest(
                group=pb.Resource(name="rescue-limit-tx-txmsg-rescue"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name=DISCARD_TOPIC), id=0),
                filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
                batch_size=1,
                auto_renew=True,
            ),
            metadata=METADATA,
            timeout=10,
        )
        statuses = [r.status.code for r in receive if r.WhichOneof("content") == "status"]
        assert statuses == [pb.Code.ILLEGAL_TOPIC]


@pytest.mark.parametrize("backend_name", ["rocketmq5"])
def test_rocketmq5_without_a_name_server_runs_without_the_rescue_and_says_so(
    make_app: Callable[..., TxMsg], broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    topic = transaction_topic(broker, "rescue-unreachable")
    app = make_app(name_server=None)
    app.add_transactional_listener(listener_class(Ledger()), group="rescue-nons", topics=[topic])
    with caplog.at_level(logging.WARNING, logger="txmsg.rescue"), app:
        assert app.rescuers == {}
        app.transactional_producer("rescue-nons").send_in_transaction(
            topic, {"order": 1}, arg="commit"
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "txmsg.rescue"]
    assert len(lines) == 1
    assert "rescue-nons" in lines[0]
    assert "NOT rescued" in lines[0]
    assert "cannot access system topic" in lines[0]
    assert "name_server" in lines[0]


def test_doctor_says_whether_rocketmq5_rescues_discards() -> None:
    label, detail, ok = rescue_row(None)
    assert label == "discarded half messages rescued"
    assert not ok
    assert detail.startswith("NO: ")
    assert "TXMSG_NAME_SERVER" in detail
    label, detail, ok = rescue_row("127.0.0.1:9876")
    assert ok
    assert detail == "yes: TRANS_CHECK_MAX_TIME_TOPIC read via name server 127.0.0.1:9876"
