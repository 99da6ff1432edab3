"""gRPC fuzzing: malformed and random ``apache.rocketmq.v2`` requests against a live gRPC endpoint.

Per input: one call of one ``MessagingService`` RPC with a deadline, the body either raw random bytes
(the server must refuse what does not parse) or a random but well-formed protobuf message built from
the request's descriptor (every field, nested messages and repeated fields, strings from the remoting
fuzzer's interesting strings, sometimes a real topic / a real receipt handle so the deeper paths run).
What must hold: the call ends before its deadline (no hang; ReceiveMessage long-polls at most up to the
deadline, as the proxy does), a refused body gets a gRPC status rather than a dropped connection, no
answer is an unhandled Python exception dressed as INTERNAL_SERVER_ERROR, and the broker logs no
traceback. ``tests/fuzz/test_grpc_fuzz.py`` runs it with hypothesis; after the run the endpoint must
still serve a well-behaved producer and consumer.

``Telemetry`` is a bidirectional stream, so it gets its own call (:func:`call_telemetry`): one stream
per input carrying one to four commands (each raw bytes or a random ``TelemetryCommand``), then the
client half-closes.  The same properties hold: the stream ends before its deadline (the broker closes
its side once the client's is closed), a command that does not parse ends the stream with INTERNAL,
and no answer is an unhandled exception.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .inputs import INTERESTING_STRINGS

#: RPC name -> (request class name, response class name, server streaming)
METHODS: dict[str, tuple[str, str, bool]] = {
    "QueryRoute": ("QueryRouteRequest", "QueryRouteResponse", False),
    "Heartbeat": ("HeartbeatRequest", "HeartbeatResponse", False),
    "SendMessage": ("SendMessageRequest", "SendMessageResponse", False),
    "QueryAssignment": ("QueryAssignmentRequest", "QueryAssignmentResponse", False),
    "ReceiveMessage": ("ReceiveMessageRequest", "ReceiveMessageResponse", True),
    "AckMessage": ("AckMessageRequest", "AckMessageResponse", False),
    "ForwardMessageToDeadLetterQueue": (
        "ForwardMessageToDeadLetterQueueRequest",
        "ForwardMessageToDeadLetterQueueResponse",
        False,
    ),
    "EndTransaction": ("EndTransactionRequest", "EndTransactionResponse", False),
    "NotifyClientTermination": (
        "NotifyClientTerminationRequest",
        "NotifyClientTerminationResponse",
        False,
    ),
    "ChangeInvisibleDuration": (
        "ChangeInvisibleDurationRequest",
        "ChangeInvisibleDurationResponse",
        False,
    ),
}
SERVICE = "/apache.rocketmq.v2.MessagingService/"
DEADLINE_S = 8.0
#: an answer that is really an unhandled exception (the servicer's catch-all: "KeyError: 'x'")
_PY_EXCEPTION = re.compile(r"^[A-Z][A-Za-z]*(Error|Exception|Exit|Interrupt)\b.*: ")


@dataclass
class Outcome:
    method: str
    grpc_code: str  # "OK" or the grpc.StatusCode name
    details: str
    status_codes: list[int]  # the response status code(s) (one per stream message with a status)
    status_messages: list[str]
    seconds: float


def svc() -> Any:
    from rocketmq.grpc_protocol import service_pb2  # noqa: PLC0415 - optional dependency (the grpc extra)

    return service_pb2


def _fill(message: Any, rnd: random.Random, hints: list[str], depth: int = 0) -> None:
    """Random values for (some of) the fields of ``message``, recursively."""
    for field in message.DESCRIPTOR.fields:
        if rnd.random() < 0.35:
            continue
        F = field  # the FieldDescriptor constants (TYPE_*) are on every field
        repeated = _repeated(field)
        count = rnd.choice((1, 1, 2, 3)) if repeated else 1
        for _ in range(count):
            if field.type == F.TYPE_MESSAGE:
                if depth > 4:
                    continue
                if field.message_type.GetOptions().map_entry:
                    getattr(message, field.name)[_text(rnd, hints)] = _text(rnd, hints)
                    continue
                target = (
                    getattr(message, field.name).add() if repeated else getattr(message, field.name)
                )
                if field.message_type.full_name in (
                    "google.protobuf.Duration",
                    "google.protobuf.Timestamp",
                ):
                    target.seconds = rnd.choice(
                        (0, 1, 5, 30, -1, 3600 * 48, int(time.time()), 2**40, -(2**40))
                    )
                    target.nanos = rnd.choice((0, 1, 999_999_999))
                else:
                    target.SetInParent()
                    _fill(target, rnd, hints, depth + 1)
                continue
            value = _scalar(field, rnd, hints)
            if repeated:
                getattr(message, field.name).append(value)
            else:
                setattr(message, field.name, value)


def _text(rnd: random.Random, hints: list[str]) -> str:
    roll = rnd.random()
    if roll < 0.3 and hints:
        return rnd.choice(hints)
    if roll < 0.7:  # protobuf strings are UTF-8: lone surrogates become "?"
        return rnd.choice(INTERESTING_STRINGS).encode("utf-8", "replace").decode()
    return "".join(chr(rnd.randrange(0x20, 0x3000)) for _ in range(rnd.randrange(0, 12)))


def _repeated(field: Any) -> bool:
    """protobuf 6 has ``is_repeated``; older runtimes only ``label``."""
    flag = getattr(field, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return bool(field.label == field.LABEL_REPEATED)


def _scalar(field: Any, rnd: random.Random, hints: list[str]) -> Any:
    F = field  # the FieldDescriptor constants (TYPE_*) are on every field
    t = field.type
    if t == F.TYPE_STRING:
        return _text(rnd, hints)
    if t == F.TYPE_BYTES:
        return rnd.randbytes(rnd.choice((0, 1, 16, 1024)))
    if t == F.TYPE_BOOL:
        return rnd.random() < 0.5
    if t == F.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        return rnd.choice(values)
    if t in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return rnd.choice((0.0, -1.0, 2.0, 1e300 if t == F.TYPE_DOUBLE else 1e30))
    bits = (
        64
        if t in (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64)
        else 32
    )
    unsigned = t in (F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_FIXED32, F.TYPE_FIXED64)
    choices = [0, 1, 2, 31, 32, 33, 1000, 2 ** (bits - 1) - 1]
    if not unsigned:
        choices += [-1, -(2 ** (bits - 1))]
    return rnd.choice(choices)


TELEMETRY = "Telemetry"
"""The bidirectional-streaming RPC (request and response class: ``TelemetryCommand``)."""


def random_request(method: str, rnd: random.Random, hints: list[str]) -> bytes:
    """A well-formed but random request of ``method`` (an RPC of :data:`METHODS` or
    :data:`TELEMETRY`), serialized."""
    name = "TelemetryCommand" if method == TELEMETRY else METHODS[method][0]
    request = getattr(svc(), name)()
    _fill(request, rnd, hints)
    data: bytes = request.SerializeToString()
    return data


def _metadata(client_id: str | None) -> list[tuple[str, str]]:
    metadata = [
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
    ]
    if client_id:
        metadata.append(("x-mq-client-id", client_id))
    return metadata


def _outcome(method: str, responses: Callable[[], Iterable[Any]]) -> Outcome:
    """Read every answer ``responses()`` yields into an Outcome; an RPC error is its status."""
    import grpc  # noqa: PLC0415 - optional dependency (the grpc extra)

    started = time.monotonic()
    codes: list[int] = []
    messages: list[str] = []
    try:
        for response in responses():
            if response.HasField("status"):
                codes.append(response.status.code)
                messages.append(response.status.message)
        code, details = "OK", ""
    except grpc.RpcError as exc:
        code, details = exc.code().name, exc.details() or ""
    return Outcome(method, code, details, codes, messages, time.monotonic() - started)


def call(
    channel: Any, method: str, body: bytes, client_id: str | None, deadline_s: float = DEADLINE_S
) -> Outcome:
    """One raw call (``body`` is sent as is); never raises for an RPC error."""
    response_type = getattr(svc(), METHODS[method][1])
    streaming = METHODS[method][2]
    make: Callable[..., Any] = channel.unary_stream if streaming else channel.unary_unary
    stub = make(
        SERVICE + method,
        request_serializer=lambda b: b,
        response_deserializer=response_type.FromString,
    )

    def responses() -> Iterable[Any]:
        result = stub(body, metadata=_metadata(client_id), timeout=deadline_s)
        return result if streaming else (result,)

    return _outcome(method, responses)


def call_telemetry(
    channel: Any, bodies: list[bytes], client_id: str | None, deadline_s: float = DEADLINE_S
) -> Outcome:
    """One Telemetry stream: send ``bodies`` as they are, half-close, read every answer until the
    broker ends the stream; never raises for an RPC error."""
    stub = channel.stream_stream(
        SERVICE + TELEMETRY,
        request_serializer=lambda b: b,
        response_deserializer=svc().TelemetryCommand.FromString,
    )
    return _outcome(
        TELEMETRY, lambda: stub(iter(bodies), metadata=_metadata(client_id), timeout=deadline_s)
    )


def problems(outcome: Outcome, *, parseable: bool) -> list[str]:
    """What is wrong with one outcome (empty: fine)."""
    found: list[str] = []
    if outcome.grpc_code == "DEADLINE_EXCEEDED":
        found.append(f"{outcome.method}: no answer within {DEADLINE_S} s (hang)")
    elif outcome.grpc_code != "OK" and not _expected_status(outcome, parseable):
        found.append(f"{outcome.method}: gRPC status {outcome.grpc_code} {outcome.details!r}")
    for code, message in zip(outcome.status_codes, outcome.status_messages, strict=True):
        if _PY_EXCEPTION.match(message):
            found.append(
                f"{outcome.method}: unhandled exception answered as status {code}: {message[:300]}"
            )
    return found


def _expected_status(outcome: Outcome, parseable: bool) -> bool:
    """Whether a non-OK transport status is an answer the real proxy gives too: INTERNAL for a body
    that does not deserialize (as grpc-java), and on Telemetry the abort of a settings command the
    proxy refuses (``process client telemetryCommand failed``, INVALID_ARGUMENT or INTERNAL)."""
    if not parseable and outcome.grpc_code == "INTERNAL":
        return True
    return (
        outcome.method == TELEMETRY
        and outcome.grpc_code in ("INVALID_ARGUMENT", "INTERNAL")
        and outcome.details.startswith("process client telemetryCommand failed")
    )
