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
from txmsg_broker.fuzz.grpc_live import (
    METHODS,
    TELEMETRY,
    call,
    call_telemetry,
    problems,
    random_request,
)
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
    send = channel.unary_unary(
        "/apache.rocketmq.v2.MessagingService/SendMessage",
        request_serializer=svc.SendMessageRequest.SerializeToString,
        response_deserializer=svc.SendMessageResponse.FromString,
    )
    msg_id = uuid.uuid4().hex.upper()
    sent = send(
        svc.SendMessageRequest(
            messages=[
                pb.Message(
                    topic=pb.Resource(name=topic),
                    body=b"good",
                    system_properties=pb.SystemProperties(
                        message_id=msg_id, message_type=pb.MessageType.NORMAL
                    ),
                )
            ]
        ),
        metadata=md,
        timeout=10,
    )
    assert sent.status.code == pb.Code.OK, sent.status
    receive = channel.unary_stream(
        "/apache.rocketmq.v2.MessagingService/ReceiveMessage",
        request_serializer=svc.ReceiveMessageRequest.SerializeToString,
        response_deserializer=svc.ReceiveMessageResponse.FromString,
    )
    ack = channel.unary_unary(
        "/apache.rocketmq.v2.MessagingService/AckMessage",
        request_serializer=svc.AckMessageRequest.SerializeToString,
        response_deserializer=svc.AckMessageResponse.FromString,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name=group),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
            batch_size=32,
        )
        request.invisible_duration.FromSeconds(30)
        request.long_polling_timeout.FromSeconds(5)
        for response in receive(request, metadata=md, timeout=15):
            if (
                response.HasField("message")
                and response.message.system_properties.message_id == msg_id
            ):
                acked = ack(
                    svc.AckMessageRequest(
                        group=pb.Resource(name=group),
                        topic=pb.Resource(name=topic),
                        entries=[
                            svc.AckMessageEntry(
                                message_id=msg_id,
                                receipt_handle=response.message.system_properties.receipt_handle,
                            )
                        ],
                    ),
                    metadata=md,
                    timeout=10,
                )
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
        assert len(seen) >= min(10, EXAMPLES // 10), (
            f"the inputs reached too few answers: {sorted(seen)}"
        )
        assert served(channel, topic, group), "the endpoint stopped serving a well-behaved client"


def test_random_telemetry_streams_never_hang_crash_or_stop_the_endpoint(txmsg_grpc_broker):
    """Telemetry is a bidirectional stream: each input is one stream of one to four commands, raw bytes
    or random TelemetryCommands (settings with random publishing/subscription data, thread stack
    traces, verify results, ...), then the client half-closes.  Every stream must end before its
    deadline with an answer the proxy gives too, the broker logs no traceback, and the endpoint
    keeps serving a well-behaved client afterwards."""
    broker = txmsg_grpc_broker
    topic, group = unique("G5TeleFuzz"), unique("G5TeleFuzzCG")
    create_topic(broker.namesrv_addr, topic, queues=2, message_type="NORMAL")
    hints = [topic, group, "broker-a", "%DLQ%" + group, "*"]
    logs = LogWatcher(broker.log_dir)
    findings: list[str] = []
    seen: set[tuple[str, int | str]] = set()
    command = st.tuples(st.one_of(st.none(), st.binary(max_size=256)), st.integers(0, 2**32 - 1))
    with grpc.insecure_channel(broker.grpc_endpoint) as channel:

        @settings(
            max_examples=max(20, EXAMPLES // 4),
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(
            commands=st.lists(command, min_size=1, max_size=4),
            client=st.sampled_from(["fuzz-telemetry", "", None]),
        )
        def one(commands: list[tuple[bytes | None, int]], client: str | None) -> None:
            bodies = [
                raw if raw is not None else _telemetry_command(seed, topic, group, hints)
                for raw, seed in commands
            ]
            outcome = call_telemetry(channel, bodies, client)
            parseable = all(_parses(TELEMETRY, body) for body in bodies)
            found = problems(outcome, parseable=parseable) + logs.new_findings()
            findings.extend(f"{f} <- {[b[:80] for b in bodies]!r}" for f in found)
            seen.add((outcome.grpc_code, outcome.status_codes[0] if outcome.status_codes else "-"))
            assert not found, found

        one()
        assert not findings
        print(sorted(seen, key=str))
        assert len(seen) >= 3, (
            f"the streams reached too few kinds of answer: {sorted(seen, key=str)}"
        )
        assert served(channel, topic, group), "the endpoint stopped serving a well-behaved client"


def _telemetry_command(seed: int, topic: str, group: str, hints: list[str]) -> bytes:
    """Mostly a random TelemetryCommand; one in four a valid producer or consumer settings command
    (random fields on top), so the stream also reaches the settings handshake and its session."""
    rnd = random.Random(seed)
    if seed % 4:
        return random_request(TELEMETRY, rnd, hints)
    command = svc.TelemetryCommand()
    settings_ = command.settings
    if seed % 8 == 0:
        settings_.client_type = pb.ClientType.PRODUCER
        settings_.publishing.topics.add(name=topic)
    else:
        settings_.client_type = pb.ClientType.SIMPLE_CONSUMER
        settings_.subscription.group.name = group
        settings_.subscription.subscriptions.add(
            topic=pb.Resource(name=topic),
            expression=pb.FilterExpression(type=pb.FilterType.TAG, expression="*"),
        )
    settings_.request_timeout.FromSeconds(rnd.choice((0, 3, 3600)))
    return bytes(command.SerializeToString())


def _parses(method: str, raw: bytes) -> bool:
    name = "TelemetryCommand" if method == TELEMETRY else METHODS[method][0]
    try:
        getattr(svc, name).FromString(raw)
    except Exception:  # noqa: BLE001 - any decode failure
        return False
    return True
