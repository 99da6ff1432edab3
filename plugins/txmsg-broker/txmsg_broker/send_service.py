"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).

Checks mirror the Java broker (topic exists or is auto-created, queue id in range, writable) plus the
size limit (MESSAGE_ILLEGAL 13, like Java's ``maxMessageSize``) and RocketMQ 5 topic types: a
transactional message to a topic typed NORMAL, or a plain one to a topic typed TRANSACTION, is rejected
with MESSAGE_ILLEGAL and a remark that says what to do. Transactional (``TRAN_MSG=true``) messages are
handed to the transaction service, which stores them as invisible half messages. A send the store cannot
append (full disk) is refused with SERVICE_NOT_AVAILABLE (14) and 4.9.8's remark (``diskfull``).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from . import diskfull
from .client_service import learn_producer_from_request
from .codec import (
    MESSAGE_ILLEGAL,
    NO_PERMISSION,
    SEND_BATCH_MESSAGE,
    SEND_MESSAGE,
    SEND_MESSAGE_V2,
    SYSTEM_ERROR,
    TOPIC_NOT_EXIST,
    RemotingCommand,
)
from .message_codec import (
    MAX_PROPERTIES_BYTES,
    PROPERTY_CLUSTER,
    PROPERTY_TRAN_MSG,
    MessageDecodeError,
    StoredMessage,
    decode_batch,
    string_to_properties,
)
from .store import NotWritableError
from .topics import (
    DEFAULT_TOPIC,
    HALF_TOPIC,
    OP_HALF_TOPIC,
    PERM_READ,
    PERM_WRITE,
    SCHEDULE_TOPIC,
    SUGGEST_APPLY_TOPIC,
    TopicConfig,
    validate_topic_name,
)
from .transport import Connection
from .txlog import ThreadNames

if TYPE_CHECKING:
    from .broker import Broker

V2_NAMES = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "brokerName",
}
#: 4.9.8/5.3.3 ``BrokerConfig.regionId`` and ``traceOn`` defaults
REGION_ID = "DefaultRegion"
TRACE_ON = "true"
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"


def stamp_send_properties(broker: Broker, props: dict[str, str]) -> dict[str, str]:
    """The properties a real broker adds to every message it stores from a send (in place).

    Why: they stay on the stored message and on every copy the broker makes of it (half message,
    check-back copies, the discarded copy in ``TRANS_CHECK_MAX_TIME_TOPIC``), where a consumer of
    that topic reads them; docs/rocketmq-facts.md has what real 4.9.8 and 5.3.3 stored.  Both
    versions put ``CLUSTER`` (``SendMessageProcessor``: the broker's cluster name); 5.3.3 also
    ``MSG_REGION`` and ``TRACE_ON`` (``AbstractSendMessageProcessor.buildMsgContext``, run for
    every send there, in 4.9.8 only when a send hook is registered, which a default broker has not).
    A 5.x proxy hides all three from gRPC consumers (``MessageConst.STRING_HASH_SET``).
    """
    if broker.config.broker_version == "5.3.3":
        props[PROPERTY_MSG_REGION] = REGION_ID
        props[PROPERTY_TRACE_SWITCH] = TRACE_ON
    props[PROPERTY_CLUSTER] = broker.config.cluster_name
    return props


#: topics clients may not write to directly
PROTECTED_TOPICS = {HALF_TOPIC, OP_HALF_TOPIC, SCHEDULE_TOPIC, DEFAULT_TOPIC}


def normalize_header(cmd: RemotingCommand) -> RemotingCommand:
    """Rewrite V2 single-letter ext keys to V1 names (in place) so one code path handles both."""
    if cmd.code in (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE) or "b" in cmd.ext_fields:
        cmd.ext_fields = {V2_NAMES.get(k, k): v for k, v in cmd.ext_fields.items()}
    return cmd


def is_transactional(props: dict[str, str]) -> bool:
    """Java's ``Boolean.parseBoolean(TRAN_MSG)``: only "true" (any case) counts."""
    return props.get(PROPERTY_TRAN_MSG, "").strip().lower() == "true"


def type_mismatch(cfg: TopicConfig, transactional: bool) -> str | None:
    mtype = cfg.message_type
    if mtype is None or mtype == "MIXED":
        return None
    if transactional and mtype != "TRANSACTION":
        return (
            f"The message type TRANSACTION is not the same as the type of topic {cfg.topic_name} "
            f"(message.type={mtype}): transactional messages are rejected. Send with a plain producer, "
            f"or create a transaction topic: txmsg topic create {cfg.topic_name} --type TRANSACTION"
        )
    if not transactional and mtype == "TRANSACTION":
        return (
            f"The message type NORMAL is not the same as the type of topic {cfg.topic_name} "
            f"(message.type=TRANSACTION): plain messages are rejected. Send it with a transactional "
            f"producer, or use a topic created with --type NORMAL"
        )
    return None


class _Target:
    """Where a send goes, once its topic and queue passed the checks."""

    __slots__ = ("cfg", "queue_id", "topic")

    def __init__(self, topic: str, cfg: TopicConfig, queue_id: int) -> None:
        self.topic, self.cfg, self.queue_id = topic, cfg, queue_id


class SendService:
    """SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE of one broker: the request's checks
    in 4.9.8's order (topic, queue, properties, type, size), then the store."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.threads = ThreadNames("SendMessageThread_", 2)

    def resolve(
        self, topic: str, conn: Connection, default_topic: str, default_queues: int
    ) -> TopicConfig | None:
        """The topic, created on this first send if the default topic allows it (4.9.8 ``msgCheck``).

        ``default_topic``/``default_queues`` are the request's (librocketmq: TBW102, 4).  The new
        topic is in the name server's routes at once, as after 4.9.8's ``registerBrokerAll``.
        """
        broker = self.broker
        cfg = broker.topics.get(topic)
        if cfg is not None or topic.startswith("%"):
            return cfg
        thread = self.threads.next()
        broker.logs.broker.warn(
            thread, f"the topic {topic} not exist, producer: /{conn.remote_addr}"
        )
        default_topic = default_topic or DEFAULT_TOPIC
        if default_topic == DEFAULT_TOPIC and not self.config.auto_create_topics:
            # 4.9.8 strips TBW102's inherit permission when autoCreateTopicEnable is off
            cfg, created = None, False
            problem = f"the default topic[{default_topic}] has no perm [{PERM_READ | PERM_WRITE}]"
        else:
            cfg, created, problem = broker.topics.create_in_send(
                topic, default_topic, default_queues
            )
        if cfg is None:
            broker.logs.broker.warn(
                thread, f"Create new topic failed, because {problem} producer:[{conn.remote_addr}]"
            )
        elif created:
            broker.logs.broker.info(
                thread,
                f"Create new topic by default topic:[{default_topic}] config:[{cfg.describe()}] "
                f"producer:[{conn.remote_addr}]",
            )
        return cfg

    async def send(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        response = await self._send(cmd, conn)
        if response.code != 0:
            # librocketmq retries and then reports only "No route info": say why here
            self.broker.logs.broker.warn(
                self.threads.next(),
                f"send to topic {cmd.ext('topic')} from {conn.remote_addr} rejected "
                f"(code {response.code}): {response.remark}"
                + (
                    f" Create it with `txmsg topic create {cmd.ext('topic')}` or run the broker with "
                    "--auto-create-topics"
                    if response.code == TOPIC_NOT_EXIST
                    else ""
                ),
            )
        return response

    async def _send(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        normalize_header(cmd)
        learn_producer_from_request(self.broker, cmd.ext("producerGroup"), conn, self.threads.next)
        target = self._target(cmd, conn)
        if isinstance(target, RemotingCommand):
            return target
        props = self._properties(cmd, target.cfg)
        if isinstance(props, RemotingCommand):
            return props
        # as 4.9.8/5.3.3 SendMessageProcessor: the header's batch flag decides, not the code
        if cmd.ext_bool("batch"):
            return await self._put_batch(cmd, conn, target, props)
        return await self._put_one(cmd, conn, target, props)

    def _target(self, cmd: RemotingCommand, conn: Connection) -> _Target | RemotingCommand:
        """The topic (created if allowed) and queue of the request, or the error response."""
        topic = cmd.ext("topic")
        problem = validate_topic_name(topic)
        if problem is not None:
            return cmd.error(SYSTEM_ERROR, f"The specified topic is invalid: {problem}")
        if topic in PROTECTED_TOPICS:
            return cmd.error(NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.")
        cfg = self.resolve(
            topic,
            conn,
            cmd.ext("defaultTopic"),
            cmd.ext_int("defaultTopicQueueNums", self.config.default_queue_nums),
        )
        if cfg is None:
            # 4.9.8's remark; the rejection line in broker.log adds what to do
            return cmd.error(
                TOPIC_NOT_EXIST,
                f"topic[{topic}] not exist, apply first please!{SUGGEST_APPLY_TOPIC}",
            )
        if not cfg.perm & PERM_WRITE:
            return cmd.error(NO_PERMISSION, f"the topic[{topic}] sending message is forbidden")
        queue_id = cmd.ext_int("queueId", 0)
        queue_nums = max(cfg.read_queue_nums, cfg.write_queue_nums)
        if queue_id < 0:
            queue_id = random.randrange(cfg.write_queue_nums)  # noqa: S311 - spreads load, not a secret
        if queue_id >= queue_nums:
            return cmd.error(
                SYSTEM_ERROR,
                f"request queueId[{queue_id}] is illegal, {cfg.describe()} Producer: {conn.remote_addr}",
            )
        return _Target(topic, cfg, queue_id)

    def _properties(
        self, cmd: RemotingCommand, cfg: TopicConfig
    ) -> dict[str, str] | RemotingCommand:
        """The request's properties once they, the topic's type and the body's size pass."""
        props_text = cmd.ext("properties")
        if len(props_text.encode()) > MAX_PROPERTIES_BYTES:
            return cmd.error(
                MESSAGE_ILLEGAL,
                f"the message properties are {len(props_text.encode())} bytes, over the limit of "
                f"{MAX_PROPERTIES_BYTES}; use fewer/shorter user properties",
            )
        props = string_to_properties(props_text)
        config = self.config
        if config.enforce_topic_types:
            mismatch = type_mismatch(cfg, is_transactional(props))
            if mismatch is not None:
                return cmd.error(MESSAGE_ILLEGAL, mismatch)
        if len(cmd.body) > config.max_message_size:
            return cmd.error(
                MESSAGE_ILLEGAL,
                f"the message body size {len(cmd.body)} bytes exceeds the broker's maxMessageSize "
                f"{config.max_message_size} bytes; send a smaller message (or split it / store the "
                f"payload elsewhere and send a reference)",
            )
        return props

    async def _put_batch(
        self, cmd: RemotingCommand, conn: Connection, target: _Target, props: dict[str, str]
    ) -> RemotingCommand:
        if is_transactional(props):
            return cmd.error(
                MESSAGE_ILLEGAL, "batch messages cannot be transactional; send them one by one"
            )
        try:
            items = decode_batch(cmd.body)
        except MessageDecodeError as exc:
            return cmd.error(MESSAGE_ILLEGAL, f"the batch message body is malformed: {exc}")
        if not items:
            return cmd.error(MESSAGE_ILLEGAL, "the batch message is empty")
        msgs = []
        for item in items:
            item_props = dict(props)
            item_props.update(item.properties)
            msgs.append(
                StoredMessage(
                    topic=target.topic,
                    queue_id=target.queue_id,
                    body=item.body,
                    flag=item.flag,
                    properties=item_props,
                    born_timestamp=cmd.ext_int("bornTimestamp", 0),
                    born_host=conn.remote_addr,
                    sys_flag=cmd.ext_int("sysFlag", 0) & ~0x1,
                    reconsume_times=cmd.ext_int("reconsumeTimes", 0),
                )
            )
        try:
            stored = self.broker.put_messages(msgs, defer_sync=True)
            await self.broker.durable()
        except NotWritableError:
            return diskfull.refuse(self.broker, cmd)
        return _stored(cmd, ",".join(m.msg_id for m in stored), target, stored[0].queue_offset)

    async def _put_one(
        self, cmd: RemotingCommand, conn: Connection, target: _Target, props: dict[str, str]
    ) -> RemotingCommand:
        broker = self.broker
        msg = StoredMessage(
            topic=target.topic,
            queue_id=target.queue_id,
            body=cmd.body,
            flag=cmd.ext_int("flag", 0),
            properties=stamp_send_properties(broker, props),
            born_timestamp=cmd.ext_int("bornTimestamp", 0),
            born_host=conn.remote_addr,
            sys_flag=cmd.ext_int("sysFlag", 0),
            reconsume_times=cmd.ext_int("reconsumeTimes", 0),
        )
        try:
            if is_transactional(props):
                stored_msg = broker.transactions.prepare(msg, defer_sync=True)
            else:
                stored_msg = broker.put_message(msg, defer_sync=True)
            await broker.durable()  # sync mode: group commit before the acknowledgement
        except NotWritableError:  # full disk: 4.9.8's SERVICE_NOT_AVAILABLE, nothing acknowledged
            return diskfull.refuse(broker, cmd)
        return _stored(cmd, stored_msg.msg_id, target, stored_msg.queue_offset)


def _stored(cmd: RemotingCommand, msg_id: str, target: _Target, offset: int) -> RemotingCommand:
    """The SEND_OK response of a stored message (or batch: its ids, its first offset)."""
    return cmd.response(
        ext_fields={
            "msgId": msg_id,
            "queueId": str(target.queue_id),
            "queueOffset": str(offset),
            "MSG_REGION": "DefaultRegion",
            "TRACE_ON": "true",
        }
    )


def install(broker: Broker) -> None:
    service = SendService(broker)
    for code in (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE):
        broker.register(code, service.send, inline=True)
