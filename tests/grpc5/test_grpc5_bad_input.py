"""Issue 13: bad gRPC requests get the 5.x proxy's status code, store nothing, and the broker keeps
serving. Requests are built with the generated stubs the official client ships
(``rocketmq.grpc_protocol``), the same messages the client itself sends.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc
from txmsg_broker.testing import unique


def metadata(client_id: str | None = "bad-input-client") -> list[tuple[str, str]]:
    md = [
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
    ]
    return [*md, ("x-mq-client-id", client_id)] if client_id else md


def message(
    topic: str, body: bytes = b"x", kind: int = pb.MessageType.NORMAL, **system: object
) -> pb.Message:
    sp = pb.SystemProperties(
        message_id=system.pop("message_id", uuid.uuid4().hex.upper()), message_type=kind, **system
    )
    return pb.Message(topic=pb.Resource(name=topic), body=body, system_properties=sp)


def send(stub, *messages: pb.Message, client_id: str | None = "bad-input-client"):
    return stub.SendMessage(
        svc.SendMessageRequest(messages=list(messages)), metadata=metadata(client_id), timeout=10
    )


@pytest.fixture
def grpc_stub(txmsg_grpc_broker):
    with grpc.insecure_channel(txmsg_grpc_broker.grpc_endpoint) as channel:
        yield txmsg_grpc_broker, channel, svc_grpc.MessagingServiceStub(channel)


def create(broker, topic: str, kind: str) -> None:
    subprocess.run(
        [
            str(Path(sys.executable).with_name("txmsg")),
            "topic",
            "create",
            topic,
            "--type",
            kind,
            "--namesrv",
            broker.namesrv_addr,
            "--queues",
            "1",
        ],
        check=True,
        capture_output=True,
    )


def test_bad_requests_get_the_proxy_codes_and_store_nothing(grpc_stub):
    broker, channel, stub = grpc_stub
    normal, tx = unique("G5Normal"), unique("G5Tx")
    create(broker, normal, "normal")
    create(broker, tx, "transaction")
    Code = pb.Code

    # malformed protobuf: the transport refuses it before any handler (grpc-java: INTERNAL too)
    raw = channel.unary_unary(
        "/apache.rocketmq.v2.MessagingService/SendMessage",
        request_serializer=lambda b: b,
        response_deserializer=svc.SendMessageResponse.FromString,
    )
    with pytest.raises(grpc.RpcError) as info:
        raw(b"\x0a\xff\xff\xff\xff\x0f garbage", metadata=metadata(), timeout=10)
    assert info.value.code() == grpc.StatusCode.INTERNAL

    # no x-mq-client-id header
    assert send(stub, message(normal), client_id=None).status.code == Code.CLIENT_ID_REQUIRED
    assert send(stub, message(normal), client_id=None).status.message == "client id cannot be empty"
    route = stub.QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name=normal)), metadata=metadata(None), timeout=10
    )
    assert route.status.code == Code.CLIENT_ID_REQUIRED

    # unknown topic: route and send
    ghost = unique("G5Ghost")
    route = stub.QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name=ghost)), metadata=metadata(), timeout=10
    )
    assert route.status.code == Code.TOPIC_NOT_FOUND
    assert f"No topic route info in name server for the topic: {ghost}" in route.status.message
    assert send(stub, message(ghost)).status.code == Code.TOPIC_NOT_FOUND

    # wrong message type for the topic (the client checks this itself first; the broker too)
    wrong = send(stub, message(tx))
    assert wrong.status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert wrong.status.message == (
        "TopicMessageType validate failed, the expected type is TRANSACTION, but actual type is NORMAL"
    )
    assert send(stub, message(normal, kind=pb.MessageType.TRANSACTION)).status.code == (
        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    )

    # oversized body, empty body, system topic, illegal topic, no message, blank message id
    big = send(stub, message(normal, body=b"x" * (4 * 1024 * 1024 + 1)))
    assert big.status.code == Code.MESSAGE_BODY_TOO_LARGE
    assert big.status.message == "message body cannot exceed the max 4194304"
    assert send(stub, message(normal, body=b"")).status.code == Code.MESSAGE_BODY_EMPTY
    assert send(stub, message("RMQ_SYS_TRANS_HALF_TOPIC")).status.code == Code.ILLEGAL_TOPIC
    assert send(stub, message("bad topic!")).status.code == Code.ILLEGAL_TOPIC
    assert send(stub).status.code == Code.MESSAGE_CORRUPTED
    assert send(stub, message(normal, message_id=" ")).status.code == Code.ILLEGAL_MESSAGE_ID
    assert send(stub, message(normal, tag="a|b")).status.code == Code.ILLEGAL_MESSAGE_TAG

    # EndTransaction: no transaction id, unknown transaction
    end = stub.EndTransaction(
        svc.EndTransactionRequest(topic=pb.Resource(name=tx), message_id="x", transaction_id=""),
        metadata=metadata(),
        timeout=10,
    )
    assert end.status.code == Code.INVALID_TRANSACTION_ID
    end = stub.EndTransaction(
        svc.EndTransactionRequest(
            topic=pb.Resource(name=tx),
            message_id="x",
            transaction_id="nope",
            resolution=pb.TransactionResolution.COMMIT,
        ),
        metadata=metadata(),
        timeout=10,
    )
    assert end.status.code == Code.INTERNAL_SERVER_ERROR
    assert end.status.message == "cannot found transaction data"

    # heartbeat / termination before any settings; consumer RPCs until the consumer half exists
    assert stub.Heartbeat(
        svc.HeartbeatRequest(), metadata=metadata("fresh"), timeout=10
    ).status.code == (Code.UNRECOGNIZED_CLIENT_TYPE)

    # still serving, and nothing was stored: the first good message on each 1-queue topic is offset 0
    ok = send(stub, message(normal))
    assert ok.status.code == Code.OK
    assert ok.entries[0].offset == 0
    ok = send(stub, message(tx, kind=pb.MessageType.TRANSACTION))
    assert ok.status.code == Code.OK
    assert ok.entries[0].offset == 0
    assert ok.entries[0].transaction_id == ok.entries[0].message_id
    time.sleep(0.2)
    assert broker.running
    assert "Traceback" not in (broker.log_dir / "console.log").read_text(errors="replace")


def test_routes_fifo_delay_and_unspecified_end(grpc_stub):
    broker, _channel, stub = grpc_stub
    fifo, delay, tx = unique("G5Fifo"), unique("G5Delay"), unique("G5TxU")
    create(broker, fifo, "fifo")
    create(broker, delay, "delay")
    create(broker, tx, "transaction")
    Code = pb.Code
    route = stub.QueryRoute(
        svc.QueryRouteRequest(topic=pb.Resource(name=tx)), metadata=metadata(), timeout=10
    )
    assert route.status.code == Code.OK
    (queue,) = route.message_queues
    assert list(queue.accept_message_types) == [pb.MessageType.TRANSACTION]
    assert queue.permission == pb.Permission.READ_WRITE
    assert queue.broker.id == 0
    assert (
        f"{queue.broker.endpoints.addresses[0].host}:{queue.broker.endpoints.addresses[0].port}"
        == (broker.grpc_endpoint)
    )
    # FIFO: message groups accepted; DELAY: a delivery timestamp is a DELAY message
    r = send(stub, message(fifo, kind=pb.MessageType.FIFO, message_group="order-1"))
    assert r.status.code == Code.OK
    assert send(stub, message(fifo)).status.code == Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    when = pb.SystemProperties().delivery_timestamp.__class__(seconds=int(time.time()) + 2)
    assert (
        send(stub, message(delay, kind=pb.MessageType.DELAY, delivery_timestamp=when)).status.code
        == Code.OK
    )
    # EndTransaction UNSPECIFIED from the client: unknown, nothing changes; then ROLLBACK works
    half = send(stub, message(tx, kind=pb.MessageType.TRANSACTION)).entries[0]
    for resolution in (
        pb.TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
        pb.TransactionResolution.ROLLBACK,
    ):
        end = stub.EndTransaction(
            svc.EndTransactionRequest(
                topic=pb.Resource(name=tx),
                message_id=half.message_id,
                transaction_id=half.transaction_id,
                resolution=resolution,
                source=pb.TransactionSource.SOURCE_CLIENT,
            ),
            metadata=metadata(),
            timeout=10,
        )
        assert end.status.code == Code.OK
    log = (broker.log_dir / "transaction.log").read_text()
    assert (
        "end transaction in sending message,  and it's pending status.RequestHeader: EndTransactionRequestHeader{"
        in log
    )
    assert (
        "end transaction in sending message, rollback the message.RequestHeader: EndTransactionRequestHeader{"
        in log
    )
    # consumer RPCs answer NOT_IMPLEMENTED until txmsg_broker.grpc.consumer exists
    ack = stub.AckMessage(
        svc.AckMessageRequest(topic=pb.Resource(name=tx)), metadata=metadata(), timeout=10
    )
    assert ack.status.code in (Code.NOT_IMPLEMENTED, Code.OK) or ack.status.code >= Code.BAD_REQUEST
