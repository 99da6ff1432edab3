"""Property tests against a LIVE gRPC endpoint: malformed bytes and random well-formed requests of
every ``MessagingService`` RPC get an answer before their deadline - never a hang, a dropped connection,
an unhandled exception or a traceback in the broker log - and afterwards the endpoint still serves a
producer and a consumer (``txmsg_broker.fuzz.grpc_live``). Budget: ``TXMSG_FUZZ_EXAMPLES`` (default 200).
"""

from __future__ import annotations

import os
import random
import time
import uuid

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from txmsg_broker.fuzz.grpc_live import METHODS, call, problems, random_request
from txmsg_broker.fuzz.live import LogWatcher
from txmsg_broker.testing import create_topic, unique

pytest.importorskip("rocketmq.grpc_protocol")
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

EXAMPLES = int(os.environ.get("TXMSG_FUZZ_EXAMPLES", "200"))
LIVE = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def served(channel, topic: str, group: str) -> bool:
    """A well-behaved send, receive and ack on the same endpoint."""
    md = [("x-mq-client-id", f"fuzz-good-{uuid.uuid4().hex}"), ("x-mq-client-version", "5.1.2")]
    send = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage",
                               request_serializer=svc.SendMessageRequest.SerializeToString,
                               response_deserializer=svc.SendMessageResponse.FromString)
    msg_id = uuid.uuid4().hex.upper()
    sent = send(svc.SendMessageRequest(messages=[pb.Message(
        topic=pb.Resource(name=topic), body=b"good",
        system_properties=pb.SystemProperties(message_id=msg_id, message_type=pb.MessageType.NORMAL))]),
        metadata=md, timeout=10)
    assert sent.status.code == pb.Code.OK, sent.status
    receive = channel.unary_stream("/apache.rocketmq.v2.MessagingService/ReceiveMessage",
                                   request_serializer=svc.ReceiveMessageRequest.SerializeToString,
                                   response_deserializer=svc.ReceiveMessageResponse.FromString)
    ack = channel.unary_unary("/apache.rocketmq.v2.MessagingService/AckMessage",
                              request_serializer=svc.AckMessageRequest.SerializeToString,
                              response_deserializer=svc.AckMessageResponse.FromString)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name=group), message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"), batch_size=32)
        request.invisible_duration.FromSeconds(30)
        request.long_polling_timeout.FromSeconds(5)
        for response in receive(request, metadata=md, timeout=15):
            if response.HasField("message") and response.message.system_properties.message_id == msg_id:
                acked = ack(svc.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic),
                                                  entries=[svc.AckMessageEntry(
                                                      message_id=msg_id,
                                                      receipt_handle=response.message.system_properties.receipt_handle)]),
                            metadata=md, timeout=10)
                return bool(acked.status.code == pb.Code.OK)
    return False


def test_random_grpc_requests_never_hang_crash_or_stop_the_endpoint(txmsg_grpc_broker):
    broker = txmsg_grpc_broker
    topic, group = unique("G5Fuzz"), unique("G5FuzzCG")
    create_topic(broker.namesrv_addr, topic, queues=2, message_type="NORMAL")
    handle = f"0 {int(time.time() * 1000)} 60000 0 0 broker-a 0 0 0"
    hints = [topic, group, handle, "broker-a", "%DLQ%" + group, "*"]
    logs = LogWatcher(broker.log_dir)
    findings: list[str] = []
    seen: set[tuple[str, int]] = set()
    with grpc.insecure_channel(broker.grpc_endpoint) as channel:

        @LIVE
        @given(
            method=st.sampled_from(sorted(METHODS)),
            raw=st.one_of(st.none(), st.binary(max_size=512)),
            seed=st.integers(0, 2**32 - 1),
            client=st.sampled_from(["fuzz-client", "", None]),
        )
        def one(method: str, raw: bytes | None, seed: int, client: str | None) -> None:
            body = raw if raw is not None else random_request(method, random.Random(seed), hints)
            outcome = call(channel, method, body, client)
            parseable = raw is None or _parses(method, raw)
            found = problems(outcome, parseable=parseable) + logs.new_findings()
            findings.extend(f"{f} <- {body[:200]!r}" for f in found)
            seen.update((method, code) for code in outcome.status_codes)
            assert not found, found

        one()
        assert not findings
        print(sorted(seen))
        assert len(seen) >= min(10, EXAMPLES // 10), f"the inputs reached too few answers: {sorted(seen)}"
        assert served(channel, topic, group), "the endpoint stopped serving a well-behaved client"


def _parses(method: str, raw: bytes) -> bool:
    try:
        getattr(svc, METHODS[method][0]).FromString(raw)
    except Exception:  # noqa: BLE001 - any decode failure
        return False
    return True
