"""SendMessage and EndTransaction over the broker's own store and transaction service.

Validation follows the 5.x proxy (``SendMessageActivity``, ``ProducerProcessor``,
``DefaultTopicMessageTypeValidator``, ``EndTransactionActivity``) in its order, so each bad request gets
the proxy's code and message and nothing is stored. State changes are the remoting broker's own
(``TransactionService.prepare/commit/write_op``): one half queue, one op queue, one check loop.
transaction.log lines are written in the 5.x format (``EndTransactionRequestHeader{...}`` unquoted,
no ``bname``).
"""

from __future__ import annotations

import random
import time
import unicodedata
import zlib
from typing import TYPE_CHECKING, Any

from ..end_transaction import end_problem
from ..message_codec import PROPERTY_PGROUP, PROPERTY_UNIQ_KEY, StoredMessage
from ..send_service import PROTECTED_TOPICS, stamp_send_properties
from ..topics import HALF_TOPIC, PERM_WRITE, SYSTEM_TOPICS, TopicConfig, validate_topic_name
from ..transaction_service import COMMIT, ROLLBACK, UNKNOWN, end_transaction_header
from ..txlog import ThreadNames
from .convert import SYSTEM_PROPERTIES, to_stored, topic_message_type
from .sessions import ClientSession, Sessions
from .status import ProxyError, ok, topic_not_found
from .stubs import Code, pb, svc

if TYPE_CHECKING:
    from ..broker import Broker

MAX_MESSAGE_GROUP_SIZE = 64  # ProxyConfig.maxMessageGroupSize
MAX_USER_PROPERTY_NUM = 128  # ProxyConfig.userPropertyMaxNum
MAX_USER_PROPERTY_SIZE = 16 * 1024  # ProxyConfig.maxUserPropertySize
MAX_DELAY_MS = 24 * 3600 * 1000  # ProxyConfig.maxDelayTimeMills
END_TX_REMARK = "end transaction from proxy"


def _has_control(text: str) -> bool:
    """Guava ``CharMatcher.javaIsoControl``: U+0000-001F and U+007F-009F."""
    return any(unicodedata.category(c) == "Cc" for c in text)


def _user_properties_size(user: Any) -> int:
    """Refuse too many, system-reserved or control-character user properties; their bytes."""
    if len(user) > MAX_USER_PROPERTY_NUM:
        raise ProxyError(
            Code.MESSAGE_PROPERTIES_TOO_LARGE,
            f"too many user properties, max is {MAX_USER_PROPERTY_NUM}",
        )
    size = 0
    for key, value in user.items():
        if key in SYSTEM_PROPERTIES:
            raise ProxyError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property is used by system: {key}"
            )
        if _has_control(key):
            raise ProxyError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                "the key of property cannot contain control character",
            )
        if _has_control(value):
            raise ProxyError(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                "the value of property cannot contain control character",
            )
        size += len(key.encode()) + len(value.encode())
    return size


def _tag_and_keys_size(sp: Any) -> int:
    """Refuse a blank, ``|``-bearing or control-character tag or key; their bytes."""
    tag = sp.tag
    if tag:
        if not tag.strip():
            raise ProxyError(
                Code.ILLEGAL_MESSAGE_TAG, "tag cannot be the char sequence of whitespace"
            )
        if "|" in tag:
            raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain '|'")
        if _has_control(tag):
            raise ProxyError(Code.ILLEGAL_MESSAGE_TAG, "tag cannot contain control character")
    size = len(tag.encode())
    for key in sp.keys:
        if key and not key.strip():
            raise ProxyError(
                Code.ILLEGAL_MESSAGE_KEY, "key cannot be the char sequence of whitespace"
            )
        if _has_control(key):
            raise ProxyError(Code.ILLEGAL_MESSAGE_KEY, "key cannot contain control character")
        size += len(key.encode())
    return size


def _check_delivery_time(sp: Any) -> None:
    if sp.HasField("delivery_timestamp"):
        deliver = sp.delivery_timestamp.seconds * 1000 + sp.delivery_timestamp.nanos // 1_000_000
        if deliver - int(time.time() * 1000) > MAX_DELAY_MS:
            raise ProxyError(
                Code.ILLEGAL_DELIVERY_TIME,
                f"the max delay time of message is too large, max is {MAX_DELAY_MS}",
            )


def _check_message_group(group: str) -> None:
    if not group:
        return
    if not group.strip():
        raise ProxyError(
            Code.ILLEGAL_MESSAGE_GROUP, "message group cannot be the char sequence of whitespace"
        )
    if len(group.encode()) >= MAX_MESSAGE_GROUP_SIZE:
        raise ProxyError(
            Code.ILLEGAL_MESSAGE_GROUP,
            f"message group exceed the max size {MAX_MESSAGE_GROUP_SIZE}",
        )
    if _has_control(group):
        raise ProxyError(
            Code.ILLEGAL_MESSAGE_GROUP, "message group cannot contain control character"
        )


def validate_topic(name: str) -> None:
    """``GrpcValidator.validateTopic``: ``Validators.checkTopic`` then no system topics."""
    if not name.strip():
        raise ProxyError(Code.ILLEGAL_TOPIC, "The specified topic is blank.")
    problem = validate_topic_name(name)
    if problem is not None:
        if len(name) > 127:
            raise ProxyError(
                Code.ILLEGAL_TOPIC, "The specified topic is longer than topic max length."
            )
        raise ProxyError(
            Code.ILLEGAL_TOPIC,
            f"The specified topic[{name}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$",
        )
    if name in SYSTEM_TOPICS or name in PROTECTED_TOPICS or name.startswith("rmq_sys_"):
        raise ProxyError(Code.ILLEGAL_TOPIC, "cannot access system topic")


def accepted_types(cfg: TopicConfig) -> list[int]:
    """``RouteActivity.parseTopicMessageType``; an untyped topic accepts every kind (MIXED), as on
    the remoting side of this broker."""
    kind = cfg.message_type or "MIXED"
    mt = pb.MessageType
    if kind == "MIXED":
        return [mt.NORMAL, mt.FIFO, mt.DELAY, mt.TRANSACTION]
    return [getattr(mt, kind, mt.MESSAGE_TYPE_UNSPECIFIED)]


def end_tx_header(
    group: str, tsto: int, clo: int, state: int, from_check: bool, msg_id: str, tx_id: str
) -> str:
    """5.x ``EndTransactionRequestHeader.toString`` (Guava ``toStringHelper``: no quotes, no bname)."""
    return end_transaction_header(5, group, tsto, clo, state, from_check, msg_id, tx_id)


class ProducerRpcs:
    def __init__(self, broker: Broker, sessions: Sessions) -> None:
        self.broker = broker
        self.sessions = sessions
        self._send_threads = ThreadNames("SendMessageThread_", 2)
        self._end_threads = ThreadNames("EndTransactionThread_", 12)

    # -- SendMessage -----------------------------------------------------------------------------
    def _validate_message(self, message: Any, topic: str) -> None:
        """The proxy's checks of a message to send, one after the other: the first that fails
        is the answer."""
        cfg = self.broker.config
        if message.topic.name != topic:
            raise ProxyError(Code.MESSAGE_CORRUPTED, "topic in message is not same")
        if len(message.body) == 0:
            raise ProxyError(Code.MESSAGE_BODY_EMPTY, "message body cannot be empty")
        if len(message.body) > cfg.max_message_size:
            raise ProxyError(
                Code.MESSAGE_BODY_TOO_LARGE,
                f"message body cannot exceed the max {cfg.max_message_size}",
            )
        sp = message.system_properties
        size = _user_properties_size(message.user_properties) + _tag_and_keys_size(sp)
        if size > MAX_USER_PROPERTY_SIZE:
            raise ProxyError(
                Code.MESSAGE_PROPERTIES_TOO_LARGE,
                f"the total size of user property is too large, max is {MAX_USER_PROPERTY_SIZE}",
            )
        if not sp.message_id.strip():
            raise ProxyError(Code.ILLEGAL_MESSAGE_ID, "message id cannot be empty")
        _check_delivery_time(sp)
        _check_message_group(sp.message_group)

    def _queue(self, cfg: TopicConfig, request: Any) -> int:
        """``SendMessageQueueSelector``: by message group hash (one message), else any writable queue."""
        writable = cfg.write_queue_nums
        if writable <= 0 or not cfg.perm & PERM_WRITE:
            raise ProxyError(Code.FORBIDDEN, "no writable queue")
        group = (
            request.messages[0].system_properties.message_group
            if len(request.messages) == 1
            else ""
        )
        if group:
            return (zlib.crc32(group.encode()) & 0x7FFFFFFF) % writable
        return random.randrange(writable)  # noqa: S311 - spreads load over queues, not a secret

    async def send_message(self, session: ClientSession, request: Any) -> Any:
        if len(request.messages) == 0:
            raise ProxyError(Code.MESSAGE_CORRUPTED, "no message to send")
        topic = request.messages[0].topic.name
        validate_topic(topic)
        for message in request.messages:
            self._validate_message(message, topic)
        cfg = self.broker.topics.get(topic)
        if cfg is None:
            raise topic_not_found(topic)
        msgs = [
            to_stored(
                m,
                queue_id=0,
                producer_group=topic,
                peer=session.peer,
                scale=self.broker.config.delay_scale,
            )
            for m in request.messages
        ]
        if self.broker.config.enforce_topic_types:
            expected = cfg.message_type or "MIXED"
            actual = topic_message_type(msgs[0].properties)
            if expected != "MIXED" and actual != expected:
                raise ProxyError(
                    Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                    f"TopicMessageType validate failed, the expected type is {expected}, but actual type is {actual}",
                )
        queue_id = self._queue(cfg, request)
        transactional = (
            request.messages[0].system_properties.message_type == pb.MessageType.TRANSACTION
        )
        stored: list[StoredMessage] = []
        for msg in msgs:
            msg.queue_id = queue_id
            # a 5.x proxy hands the message to its broker's SendMessageProcessor (local mode as
            # remote): the broker's own properties are added there, as for a remoting send
            stamp_send_properties(self.broker, msg.properties)
            if transactional:
                half = self.broker.transactions.prepare(msg, defer_sync=True)
                self.sessions.transactions[(topic, msg.properties[PROPERTY_UNIQ_KEY])] = (
                    half.queue_offset,
                    half.commit_log_offset,
                )
                stored.append(half)
            else:
                stored.append(self.broker.put_message(msg, defer_sync=True))
        await self.broker.durable()
        response = svc.SendMessageResponse(status=ok())
        for msg in stored:
            uniq = msg.properties[PROPERTY_UNIQ_KEY]
            response.entries.add(
                status=ok(),
                message_id=uniq,
                transaction_id=uniq if transactional else "",
                offset=max(0, msg.queue_offset),
            )
        return response

    # -- EndTransaction --------------------------------------------------------------------------
    def _find_half(self, group: str, transaction_id: str) -> tuple[int, int] | None:
        """The newest live half copy of ``transaction_id``: the proxy's transaction data, or a scan
        of the half queue (after a restart, or for a transaction id the endpoint never saw)."""
        service = self.broker.transactions
        known = self.sessions.transactions.get((group, transaction_id))
        if known is not None and known[0] not in service.passed:
            return known
        store = self.broker.store
        found: tuple[int, int] | None = None
        half_max = store.max_offset(HALF_TOPIC, 0)
        pos = service.cursor
        while pos < half_max:
            batch = store.get(HALF_TOPIC, 0, pos, 512)
            if not batch:
                break
            for msg in batch:
                if msg.uniq_key == transaction_id and msg.properties.get(PROPERTY_PGROUP) == group:
                    found = (msg.queue_offset, msg.commit_log_offset)
            pos += len(batch)
        return found

    def end_transaction(self, session: ClientSession, request: Any) -> Any:
        topic = request.topic.name
        validate_topic(topic)
        transaction_id = request.transaction_id
        if not transaction_id.strip():
            raise ProxyError(Code.INVALID_TRANSACTION_ID, "transaction id cannot be empty")
        resolution = request.resolution
        state = (
            COMMIT
            if resolution == pb.TransactionResolution.COMMIT
            else (ROLLBACK if resolution == pb.TransactionResolution.ROLLBACK else UNKNOWN)
        )
        from_check = request.source == pb.TransactionSource.SOURCE_SERVER_CHECK
        group = topic  # the proxy's producer group for gRPC producers
        # a manual clock's advance waits for the answers to its check-backs
        self.broker.transactions.check_backs.note_answer(None, transaction_id)
        located = self._find_half(group, transaction_id)
        if located is None:
            # TRANSACTION_DATA_NOT_FOUND is not in the proxy's code mapping: INTERNAL_SERVER_ERROR
            raise ProxyError(Code.INTERNAL_SERVER_ERROR, "cannot found transaction data")
        tsto, clo = located
        self._broker_end_transaction(
            session, group, tsto, clo, state, from_check, request.message_id, transaction_id
        )
        if state != UNKNOWN:
            self.sessions.transactions.pop((group, transaction_id), None)
        return svc.EndTransactionResponse(status=ok())

    def _broker_end_transaction(
        self,
        session: ClientSession,
        group: str,
        tsto: int,
        clo: int,
        state: int,
        from_check: bool,
        msg_id: str,
        tx_id: str,
    ) -> None:
        """``EndTransactionProcessor`` as a 5.x broker runs it for a proxy request (shared state)."""
        thread = self._end_threads.next()
        tx = self.broker.logs.transaction
        # a first-phase COMMIT at INFO logs nothing: the header is built only when a line needs it
        header = (
            end_tx_header(group, tsto, clo, state, from_check, msg_id, tx_id)
            if from_check or state != COMMIT or tx.enabled("DEBUG")
            else ""
        )
        if header:
            tx.debug(thread, f"Transaction request:{header}")
        addr = session.peer
        tail = f"RequestHeader: {header} Remark: {END_TX_REMARK}"
        if from_check:
            what = {
                UNKNOWN: "but it's pending status.",
                COMMIT: "the producer commit the message.",
                ROLLBACK: "the producer rollback the message.",
            }[state]
            tx.warn(thread, f"Check producer[{addr}] transaction state, {what}{tail}")
        elif state == UNKNOWN:
            tx.warn(
                thread,
                f"The producer[{addr}] end transaction in sending message,  and it's pending status.{tail}",
            )
        elif state == ROLLBACK:
            tx.warn(
                thread,
                f"The producer[{addr}] end transaction in sending message, rollback the message.{tail}",
            )
        if state == UNKNOWN:
            return
        service = self.broker.transactions
        half = self.broker.store.lookup(clo)
        if (
            half is not None
            and half.topic == HALF_TOPIC
            and service.rejects_late_end(half, from_check)
        ):
            service.log_late_end(thread, state, msg_id, clo)
            return
        problem = end_problem(half, tsto, group)
        if problem is not None or half is None:
            header = header or end_tx_header(group, tsto, clo, state, from_check, msg_id, tx_id)
            self.broker.logs.broker.warn(thread, f"{problem}, request from {addr}: {header}")
            return
        if tsto in service.resolved:
            if header:
                tx.debug(
                    thread,
                    f"Half offset {tsto} has been committed/rolled back, request ignored: {header}",
                )
            return
        if state == COMMIT:
            service.commit(half)
        else:
            service.write_op(half)
