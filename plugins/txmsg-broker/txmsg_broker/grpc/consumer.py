"""The consumer RPCs of the gRPC endpoint: ReceiveMessage, AckMessage, ChangeInvisibleDuration,
QueryAssignment, ForwardMessageToDeadLetterQueue, and the consumer side of Settings and Heartbeat.

Validation and answers follow the 5.x proxy (``ReceiveMessageActivity``, ``AckMessageActivity``,
``ChangeInvisibleDurationActivity``, ``RouteActivity.queryAssignment``, ``ForwardMessageToDLQActivity``,
``GrpcClientSettingsManager.mergeSubscriptionData``) in its order, so a bad request gets the proxy's code
and message; the delivery state is :mod:`.pop` over the broker's own store (see there for semantics).

Embedded-broker choices (there is no subscription group table):

* a group is FIFO exactly when its subscription group config says ``consumeMessageOrderly``
  (:mod:`..subscription_groups`, created by ``mqadmin updateSubGroup -o true``), as the proxy's
  ``mergeSubscriptionData``/``ReceiveMessageActivity`` decide; the topic's ``message.type`` does not
  matter for consuming (a FIFO topic read by a non-orderly group is popped concurrently, as on a real
  cluster), and a group nobody created is the auto-created, non-orderly default;
* the retry policy is the broker default (16 retries = 17 delivery attempts, customized back-off on the
  delay levels 1s 5s 10s ... 2h), the back-off and the 10 s minimum invisible time of a receive scaled by
  the broker's ``delay_scale`` like every other RocketMQ delay here, so tests run in milliseconds;
* gRPC consumers are not entered in the remoting consumer table: a remoting group rebalances only over
  remoting clients, and progress is per group in both worlds.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from .. import subscription_groups
from ..pull import parse_subscription
from ..topics import PERM_READ
from .convert import to_proto
from .pop import Popped, PopService
from .producer import validate_topic
from .receipts import ReceiptHandle, decode, expired, now_ms, unknown_broker
from .sessions import ClientSession
from .status import ProxyError, ok, status, topic_not_found
from .stubs import Code, pb, svc

if TYPE_CHECKING:
    from ..topics import TopicConfig
    from .server import GrpcEndpoint

#: ProxyConfig defaults
MIN_LONG_POLLING_MS = 5_000
MAX_LONG_POLLING_MS = 20_000
LONG_POLLING_BATCH_SIZE = 32
MAX_MSG_NUMS_FOR_POP = 32
DEFAULT_INVISIBLE_MS = 60_000
MIN_INVISIBLE_FOR_RECV_MS = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: SubscriptionGroupConfig defaults: retryMaxTimes 16 -> max attempts 17; CustomizedRetryPolicy.next
RETRY_MAX_TIMES = 16
RETRY_NEXT_S = (
    1,
    5,
    10,
    30,
    60,
    120,
    180,
    240,
    300,
    360,
    420,
    480,
    540,
    600,
    1200,
    1800,
    3600,
    7200,
)
GROUP_MAX_LENGTH = 120
SYS_GROUP_PREFIX = "CID_RMQ_SYS_"
ILLEGAL_POLLING_SINCE = (5, 0, 3)
CLIENT_VERSION_HEADER = "x-mq-client-version"
_VALID_NAME = re.compile(r"^[%|a-zA-Z0-9_-]+$")


def validate_group(name: str) -> None:
    """``GrpcValidator.validateConsumerGroup`` (``Validators.checkGroup`` + no system groups)."""
    if not name.strip():
        raise ProxyError(Code.ILLEGAL_CONSUMER_GROUP, "the specified group is blank")
    if len(name) > GROUP_MAX_LENGTH:
        raise ProxyError(
            Code.ILLEGAL_CONSUMER_GROUP,
            f"the specified group[{name}] is longer than group max length: {GROUP_MAX_LENGTH}.",
        )
    if not _VALID_NAME.match(name):
        raise ProxyError(
            Code.ILLEGAL_CONSUMER_GROUP,
            f"the specified group[{name}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$",
        )
    if name.startswith(SYS_GROUP_PREFIX):
        raise ProxyError(Code.ILLEGAL_CONSUMER_GROUP, "cannot use system consumer group")


def to_ms(duration: Any) -> int:
    return int(duration.seconds) * 1000 + int(duration.nanos) // 1_000_000


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = re.match(r"\d*", piece)
        parts.append(int(digits.group(0)) if digits and digits.group(0) else 0)
    return tuple(parts)


class GrpcConsumer:
    """What :func:`install` returns to the servicer (the ``ConsumerRpcs`` protocol)."""

    def __init__(self, endpoint: GrpcEndpoint) -> None:
        self.endpoint = endpoint
        self.broker = endpoint.broker
        self.pops = PopService(self.broker, self._client_alive)

    # -- helpers ---------------------------------------------------------------------------------
    def _client_alive(self, client_id: str) -> bool:
        session = self.endpoint.sessions.by_id.get(client_id)
        return session is not None and session.outbox is not None

    @property
    def scale(self) -> float:
        return self.broker.config.delay_scale

    def max_attempts(self) -> int:
        return RETRY_MAX_TIMES + 1

    def min_invisible_ms(self) -> int:
        return max(0, math.ceil(MIN_INVISIBLE_FOR_RECV_MS * self.scale))

    def _topic(self, topic: str) -> TopicConfig:
        cfg = self.broker.topics.get(topic)
        if cfg is None:
            raise topic_not_found(topic)
        return cfg

    def _fifo_group(self, group: str) -> bool:
        """``SubscriptionGroupConfig.consumeMessageOrderly`` of ``group`` (see the module docstring)."""
        return subscription_groups.of(self.broker).orderly(group)

    def _validate(self, topic: Any, group: Any) -> tuple[str, str]:
        validate_topic(topic.name)
        validate_group(group.name)
        return topic.name, group.name

    @staticmethod
    def _validate_invisible(ms: int, minimum: int = 0) -> None:
        """``GrpcValidator.validateInvisibleTime``."""
        if ms < minimum:
            raise ProxyError(
                Code.ILLEGAL_INVISIBLE_TIME, f"the invisibleTime is too small. min is {minimum}"
            )
        if ms > MAX_INVISIBLE_MS:
            raise ProxyError(
                Code.ILLEGAL_INVISIBLE_TIME,
                f"the invisibleTime is too large. max is {MAX_INVISIBLE_MS}",
            )

    # -- settings / heartbeat --------------------------------------------------------------------
    def merged_settings(self, settings: Any) -> Any:
        """``mergeSubscriptionData`` with this broker's (default) subscription group config."""
        merged = pb.Settings()
        merged.CopyFrom(settings)
        sub = merged.subscription
        sub.receive_batch_size = LONG_POLLING_BATCH_SIZE
        sub.long_polling_timeout.FromMilliseconds(MAX_LONG_POLLING_MS)
        sub.fifo = self._fifo_group(settings.subscription.group.name)
        policy = merged.backoff_policy
        policy.max_attempts = self.max_attempts()
        policy.customized_backoff.Clear()
        for seconds in RETRY_NEXT_S:
            policy.customized_backoff.next.add().FromMilliseconds(int(seconds * 1000 * self.scale))
        merged.metric.on = False
        return merged

    def apply_settings(self, session: ClientSession, settings: Any) -> Any:
        """A consumer's Settings on the telemetry stream: validated, answered merged.

        Only the group is validated, as 5.3.3's ``ClientActivity.processAndWriteClientSettings``
        does: a subscription to a system topic is accepted here and refused where the topic is
        used (QueryRoute, QueryAssignment, ReceiveMessage: ILLEGAL_TOPIC), so the official
        ``SimpleConsumer`` of ``TRANS_CHECK_MAX_TIME_TOPIC`` starts and fails at its first receive,
        as on a real 5.3.3 (docs/rocketmq-facts.md, "What a discard stores")."""
        validate_group(settings.subscription.group.name)
        return self.merged_settings(settings)

    def heartbeat(self, session: ClientSession, request: Any) -> Any:
        validate_group(request.group.name)
        return svc.HeartbeatResponse(status=ok())

    # -- ReceiveMessage --------------------------------------------------------------------------
    async def ReceiveMessage(
        self, session: ClientSession, request: Any, context: Any
    ) -> AsyncIterator[Any]:
        """Status, then the messages, then the delivery timestamp (``ReceiveMessageResponseStreamWriter``)."""
        try:
            async with contextlib.aclosing(self._receive(session, request, context)) as responses:
                async for response in responses:
                    yield response
        except ProxyError as exc:
            yield svc.ReceiveMessageResponse(status=status(exc.code, exc.message))
        except Exception as exc:  # noqa: BLE001 - the proxy's "internal server error"; the broker keeps serving
            self.broker.logs.broker.error(
                "GrpcReceiveMessage", f"gRPC ReceiveMessage failed: {exc!r}"
            )
            yield svc.ReceiveMessageResponse(
                status=status(Code.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
            )
        delivery = svc.ReceiveMessageResponse()
        delivery.delivery_timestamp.FromMilliseconds(now_ms())
        yield delivery

    def _polling_ms(self, session: ClientSession, request: Any, context: Any) -> int:
        remaining_s = context.time_remaining()
        remaining = int(remaining_s * 1000) if remaining_s is not None else None
        if request.HasField("long_polling_timeout"):
            polling = to_ms(request.long_polling_timeout)
        else:
            request_timeout = (
                to_ms(session.settings.request_timeout) if session.settings is not None else 0
            )
            polling = (
                remaining if remaining is not None else MAX_LONG_POLLING_MS
            ) - request_timeout // 2
        polling = min(max(polling, MIN_LONG_POLLING_MS), MAX_LONG_POLLING_MS)
        if remaining is not None and polling > remaining:
            if remaining >= MIN_LONG_POLLING_MS:
                polling = remaining
            else:
                version = ""
                for key, value in context.invocation_metadata() or ():
                    if key == CLIENT_VERSION_HEADER:
                        version = str(value)
                code = (
                    Code.ILLEGAL_POLLING_TIME
                    if version and _version(version) >= ILLEGAL_POLLING_SINCE
                    else Code.BAD_REQUEST
                )
                raise ProxyError(
                    code,
                    "The deadline time remaining is not enough for polling, please check network condition",
                )
        return polling

    async def _receive(
        self, session: ClientSession, request: Any, context: Any
    ) -> AsyncGenerator[Any, None]:
        polling_ms = self._polling_ms(session, request, context)
        topic, group = self._validate(request.message_queue.topic, request.group)
        auto_renew = bool(request.auto_renew)
        if auto_renew:
            invisible_ms = DEFAULT_INVISIBLE_MS
        else:
            invisible_ms = to_ms(request.invisible_duration)
            self._validate_invisible(invisible_ms, self.min_invisible_ms())
        expression = request.filter_expression
        if expression.type == pb.FilterType.SQL:
            raise ProxyError(
                Code.ILLEGAL_FILTER_EXPRESSION,
                "The broker does not support consumer to filter message by SQL92 (use a TAG expression)",
            )
        tags = parse_subscription(expression.expression)
        cfg = self._topic(topic)
        if not cfg.perm & PERM_READ or cfg.read_queue_nums <= 0:
            raise ProxyError(Code.FORBIDDEN, "no readable queue")
        queue_ids = list(range(cfg.read_queue_nums))
        batch = max(1, min(MAX_MSG_NUMS_FOR_POP, request.batch_size or LONG_POLLING_BATCH_SIZE))
        fifo = self._fifo_group(group)
        # leave the client a moment to read the answer before its own deadline
        deadline = now_ms() + max(0, polling_ms - 100)
        while True:
            popped = self.pops.pop(
                group=group,
                topic=topic,
                queue_ids=queue_ids,
                batch=batch,
                invisible_ms=invisible_ms,
                fifo=fifo,
                max_attempts=self.max_attempts(),
                tags=tags,
                client_id=session.client_id,
                auto_renew=auto_renew,
            )
            if popped:
                break
            now = now_ms()
            remaining = (deadline - now) / 1000.0
            if remaining <= 0 or self.pops.stopping or context.cancelled():
                yield svc.ReceiveMessageResponse(
                    status=status(Code.MESSAGE_NOT_FOUND, "no new message")
                )
                return
            wake = self.pops.next_wake_s(group, topic, queue_ids, now)
            await self.pops.wait(
                topic, remaining if wake is None else min(remaining, max(wake, 0.001))
            )
        written = 0
        try:
            yield svc.ReceiveMessageResponse(status=ok())
            for item in popped:
                yield svc.ReceiveMessageResponse(message=self._message(item, topic))
                written += 1
        finally:
            # processThrowableWhenWriteMessage: what did not reach the client is visible again in 1 s
            for item in popped[written:]:
                self.pops.change(group, topic, item.handle, 1000)

    def _message(self, item: Popped, topic: str) -> Any:
        message = to_proto(item.msg, topic=topic)
        sp = message.system_properties
        sp.receipt_handle = item.handle.encode()
        sp.delivery_attempt = item.delivery.attempt
        sp.invisible_duration.FromMilliseconds(item.delivery.invisible_ms)
        sp.queue_id = item.handle.queue_id
        sp.queue_offset = item.msg.queue_offset
        return message

    # -- receipt handles -------------------------------------------------------------------------
    def _handle(
        self,
        session: ClientSession,
        group: str,
        topic: str,
        text: str,
        *,
        check_expiry: bool = True,
    ) -> ReceiptHandle:
        """Decode, then the proxy's and the broker's checks, in their order."""
        handle = decode(text)
        if check_expiry and handle.is_expired():
            d = self.pops.delivery(group, topic, handle)
            # a push consumer's delivery is renewed by the proxy while its client is connected
            if d is None or not (d.auto_renew and self._client_alive(d.client_id)):
                raise expired()
        if handle.broker_name != self.broker.broker_name:
            raise unknown_broker(handle.broker_name)
        cfg = self._topic(topic)
        if not 0 <= handle.queue_id < cfg.read_queue_nums:
            raise ProxyError(
                Code.INTERNAL_SERVER_ERROR,
                f"queueId[{handle.queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                f"[{cfg.read_queue_nums}] consumer:[{session.peer}]",
            )
        store = self.broker.store
        low, high = (
            store.min_offset(topic, handle.queue_id),
            store.max_offset(topic, handle.queue_id),
        )
        if not low <= handle.offset <= high:
            raise ProxyError(
                Code.INTERNAL_SERVER_ERROR,
                f"offset is illegal, key:{topic}@{handle.queue_id}, commit:{handle.offset}, store:{low}~{high}",
            )
        return handle

    # -- AckMessage ------------------------------------------------------------------------------
    def AckMessage(self, session: ClientSession, request: Any) -> Any:
        topic, group = self._validate(request.topic, request.group)
        response = svc.AckMessageResponse()
        codes: set[int] = set()
        for entry in request.entries:
            try:
                handle = self._handle(session, group, topic, entry.receipt_handle)
                self.pops.ack(group, topic, handle)
                entry_status = ok()
            except ProxyError as exc:
                entry_status = status(exc.code, exc.message)
            response.entries.add(
                message_id=entry.message_id,
                receipt_handle=entry.receipt_handle,
                status=entry_status,
            )
            codes.add(entry_status.code)
        if len(codes) > 1:
            response.status.CopyFrom(status(Code.MULTIPLE_RESULTS))
        elif codes:
            response.status.CopyFrom(status(codes.pop()))
        else:
            response.status.CopyFrom(
                status(Code.INTERNAL_SERVER_ERROR, "ack message result is empty")
            )
        return response

    # -- ChangeInvisibleDuration -----------------------------------------------------------------
    def ChangeInvisibleDuration(self, session: ClientSession, request: Any) -> Any:
        topic, group = self._validate(request.topic, request.group)
        invisible_ms = to_ms(request.invisible_duration)
        self._validate_invisible(invisible_ms)
        handle = self._handle(session, group, topic, request.receipt_handle)
        new = self.pops.change(group, topic, handle, invisible_ms)
        return svc.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=new.encode())

    # -- ForwardMessageToDeadLetterQueue ---------------------------------------------------------
    def ForwardMessageToDeadLetterQueue(self, session: ClientSession, request: Any) -> Any:
        """``ProducerProcessor.forwardMessageToDeadLetterQueue``: the copy by commit log offset, then an
        ack of the delivery (no expiry check on this path, as in the proxy)."""
        topic, group = self._validate(request.topic, request.group)
        handle = decode(request.receipt_handle)
        if handle.commit_log_offset < 0:
            raise ProxyError(Code.INVALID_RECEIPT_HANDLE, "commit log offset is empty")
        if handle.broker_name != self.broker.broker_name:
            raise unknown_broker(handle.broker_name)
        msg = self.broker.store.lookup(handle.commit_log_offset)
        if msg is None:
            raise ProxyError(
                Code.INTERNAL_SERVER_ERROR,
                f"look message by offset failed, {handle.commit_log_offset}",
            )
        d = self.pops.delivery(group, topic, handle)
        attempts = d.attempt if d is not None else max(1, request.delivery_attempt)
        self.pops.to_dlq(group, msg, attempts, request.max_delivery_attempts or self.max_attempts())
        self.pops.ack(group, topic, handle)
        return svc.ForwardMessageToDeadLetterQueueResponse(status=ok())

    # -- QueryAssignment -------------------------------------------------------------------------
    def QueryAssignment(self, session: ClientSession, request: Any) -> Any:
        """One broker-wide queue (id -1) per broker, or every queue for a FIFO group."""
        topic, group = self._validate(request.topic, request.group)
        cfg = self._topic(topic)
        response = svc.QueryAssignmentResponse()
        if cfg.perm & PERM_READ and cfg.read_queue_nums > 0:
            endpoints = pb.Endpoints(
                scheme=pb.AddressScheme.IPv4,
                addresses=[pb.Address(host=self.endpoint.advertised_host, port=self.endpoint.port)],
            )
            broker = pb.Broker(name=self.broker.broker_name, id=0, endpoints=endpoints)
            permission = pb.Permission.READ_WRITE if cfg.perm & 2 else pb.Permission.READ
            ids = range(cfg.read_queue_nums) if self._fifo_group(group) else (-1,)
            for queue_id in ids:
                response.assignments.add().message_queue.CopyFrom(
                    pb.MessageQueue(
                        topic=request.topic, id=queue_id, permission=permission, broker=broker
                    )
                )
        if not response.assignments:
            response.status.CopyFrom(status(Code.FORBIDDEN, "no readable queue"))
        else:
            response.status.CopyFrom(ok())
        return response


def install(endpoint: GrpcEndpoint) -> GrpcConsumer:
    """Called by the servicer when it is built (see ``servicer`` for the seam)."""
    return GrpcConsumer(endpoint)
