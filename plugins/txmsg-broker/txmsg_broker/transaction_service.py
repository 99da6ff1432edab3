"""Transactional messages: half messages, op records, END_TRANSACTION (37) and the check-back loop.

Modelled on the Java 4.9 broker so outcomes *and* pitfalls match a real one:

* prepare: the message is stored in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with ``REAL_TOPIC``/``REAL_QID``;
  consumers never see that topic.
* commit/rollback (END_TRANSACTION): commit re-stores the message to its real topic/queue; both write an op
  record (``RMQ_SYS_TRANS_OP_HALF_TOPIC``, tag ``d``, body = half-queue offset). Op records and the scan cursor
  are in the commit log / offset table, so pending state survives restarts. Unknown (0) changes nothing.
* check loop (every ``check_interval_ms``, one task): from the half-queue cursor, skip resolved entries; a
  message whose ``TRANSACTION_CHECK_TIMES`` reached ``check_max`` is moved to ``TRANS_CHECK_MAX_TIME_TOPIC``;
  one with ``CHECK_IMMUNITY_TIME_IN_SECONDS`` still inside it is re-put with the count + 1 and no check (Java
  raises the count first: each pass inside the immunity uses one up, apache/rocketmq#8311);
  one older than ``transactionTimeOut`` (or its immunity) is re-put to the half queue
  with the count + 1 and CHECK_TRANSACTION_STATE (oneway) is sent for that new copy to a live channel of its
  producer group, round-robin over all the group's channels. Like Java, each copy is an independent entry: a
  slow checker that answers COMMIT for several copies commits several times (the duplicate-delivery pitfall).
  The pass reads on into the copies it re-put once they are dispatched (Java's reput thread runs every
  1 ms: :data:`REPUT_INTERVAL_S`); ``needDiscard`` comes before the "Fresh stored" stop, so the copy put
  for the *last* check-back is discarded in the same pass when the pass spent that long on other entries,
  and a COMMIT answer to that check still commits it: committed *and* discarded (4.9.8 and 5.3.3; seen on a
  real 4.9.8 with 200 transactions pending behind it, not with a lone one).
* transaction.log lines are the 4.9.8 broker's by default; ``log_format`` 5 (``txmsg broker --log-format 5``)
  writes END_TRANSACTION headers and check-backs as a 5.1+ broker does (see :func:`end_transaction_header`;
  one INFO ``Check transaction. real_topic=...`` line per check-back), so log analysers can be tested on
  both formats from live remoting runs. The gRPC endpoint always writes the 5.x format.
* ``fromTransactionCheck`` is parsed like Java's ``Boolean.parseBoolean``: librocketmq's ``"1"`` is *false*,
  so check answers from C++/Python clients are logged as send-phase lines, exactly as a real broker does.
* END_TRANSACTION is applied every time it names a live half copy, as Java's ``EndTransactionProcessor``
  does (4.9.8 and 5.3.3 keep no record of finished transactions): a second COMMIT stores the message again.

As a 5.3.3 broker (``broker_version``; 5.1+ ``TransactionalOpBatchService``) the op record of a commit or
rollback is not written at once: the half-queue offset joins a pending batch (body ``"<offset>,"`` per
transaction) written as one op message when ``transaction_op_batch_interval_ms`` has passed since the last
batch write, or at once when the batch reaches ``transaction_op_msg_max_size`` bytes.  Until then the check
service cannot see the transaction as finished: with ``transactionTimeOut`` below the batch interval it checks
committed and rolled-back transactions back, and a COMMIT answer stores the message (again).  The 5.x scan
also pauses 1 s (``SLEEP_WHILE_NO_OP``) before its first check-back when op records were read and none named
the half message.  Ops still pending at shutdown are lost unless due, as in Java (the halves are then checked
back after the restart).

The parts live in their own modules: END_TRANSACTION over remoting in :mod:`.end_transaction`, the
check loop and its pass in :mod:`.check_service`, the check-backs it sends in :mod:`.check_backs`, the
5.x op batch in :mod:`.op_batch`, and the constants and Java texts they share in
:mod:`.transaction_formats` (re-exported here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .check_backs import CheckBacks
from .check_service import CheckService
from .codec import END_TRANSACTION, RemotingCommand
from .end_transaction import EndTransactionProcessor
from .message_codec import (
    PROPERTY_CHECK_IMMUNITY,
    PROPERTY_CHECK_TIMES,
    PROPERTY_PGROUP,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    StoredMessage,
    clone,
)
from .op_batch import OpBatch
from .topics import HALF_TOPIC, OP_HALF_TOPIC
from .transaction_formats import (
    CHECK_SEND_THREAD,
    CHECK_THREAD,
    COMMIT,
    OFFSET_SEPARATOR,
    OP_BATCH_THREAD,
    OP_TAG,
    REPUT_INTERVAL_S,
    ROLLBACK,
    SLEEP_WHILE_NO_OP_MS,
    SYSTEM_GROUP,
    UNKNOWN,
    describe_message,
    end_transaction_header,
    int_or,
    java_bool,
    java_date,
    op_offsets,
)
from .transport import Connection

if TYPE_CHECKING:
    from .broker import Broker

__all__ = [
    "CHECK_SEND_THREAD",
    "CHECK_THREAD",
    "COMMIT",
    "OFFSET_SEPARATOR",
    "OP_BATCH_THREAD",
    "OP_TAG",
    "REPUT_INTERVAL_S",
    "ROLLBACK",
    "SLEEP_WHILE_NO_OP_MS",
    "SYSTEM_GROUP",
    "UNKNOWN",
    "TransactionService",
    "describe_message",
    "end_transaction_header",
    "install",
    "java_bool",
    "java_date",
    "op_offsets",
]


class TransactionService:
    """The half queue's state (which offsets an op record resolved, which were re-put or
    discarded, where the check pass got) and what changes it: prepare, commit, rollback."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.tx = broker.logs.transaction
        #: the broker's clock (:mod:`.clock`): timeout, immunity, op batches and the check interval
        self.clock = broker.clock
        self.resolved: set[int] = set()  # half-queue offsets with an op record
        self.passed: set[int] = set()  # half-queue offsets re-put as a newer copy or discarded
        self.cursor = 0
        self.op_cursor = 0
        #: 5.x op batching (``MessageQueueOpContext`` of half queue 0)
        self.ops = OpBatch(self)
        self.check_backs = CheckBacks(broker)
        self.checks = CheckService(self, self.check_backs)
        self.recover()

    @property
    def five(self) -> bool:
        """Behaves as a 5.3.3 broker (``broker_version``)."""
        return self.broker.config.broker_version == "5.3.3"

    @property
    def batching(self) -> bool:
        """Op records go through the 5.x batch (5.3.3 with a positive batch interval)."""
        return self.five and self.broker.config.op_batch_interval_ms > 0

    def start(self) -> None:
        if self.batching:
            self.ops.start()
        self.checks.start()

    async def stop(self) -> None:
        await self.ops.stop()
        await self.checks.stop()

    # -- state ----------------------------------------------------------------------------------
    def recover(self) -> None:
        """Rebuild resolved/passed sets from the op queue and the half queue (after a restart)."""
        store = self.store
        self.resolved.clear()
        self.passed.clear()
        op_max = store.max_offset(OP_HALF_TOPIC, 0)
        pos = 0
        while pos < op_max:
            batch = store.get(OP_HALF_TOPIC, 0, pos, 512)
            if not batch:
                break
            for op in batch:
                self.resolved.update(op_offsets(op.body))
            pos += len(batch)
        self.cursor = store.query_offset(SYSTEM_GROUP, HALF_TOPIC, 0) or 0
        self.op_cursor = store.query_offset(SYSTEM_GROUP, OP_HALF_TOPIC, 0) or 0
        # entries after the cursor that were already re-put: only the newest copy per UNIQ_KEY is live
        half_max = store.max_offset(HALF_TOPIC, 0)
        latest: dict[tuple[str, str], int] = {}
        pos = self.cursor
        while pos < half_max:
            batch = store.get(HALF_TOPIC, 0, pos, 512)
            if not batch:
                break
            for msg in batch:
                key = (
                    msg.properties.get(PROPERTY_PGROUP, ""),
                    msg.properties.get(PROPERTY_UNIQ_KEY, ""),
                )
                if key[1]:
                    previous = latest.get(key)
                    if previous is not None:
                        self.passed.add(previous)
                    latest[key] = msg.queue_offset
            pos += len(batch)

    # -- prepare --------------------------------------------------------------------------------
    def prepare(self, msg: StoredMessage, *, defer_sync: bool = False) -> StoredMessage:
        """Store ``msg`` as a half message (``TransactionalMessageBridge.parseHalfMessageInner``).

        5.3.3 also stamps ``__transactionId__`` with the ``UNIQ_KEY``; it stays on every copy of the
        half message, the discarded one included (seen on real 5.3.3, docs/rocketmq-facts.md)."""
        props = dict(msg.properties)
        uniq = props.get(PROPERTY_UNIQ_KEY)
        if self.five and uniq:
            props[PROPERTY_TRANSACTION_ID] = uniq
        props[PROPERTY_REAL_TOPIC] = msg.topic
        props[PROPERTY_REAL_QID] = str(msg.queue_id)
        half = clone(
            msg,
            topic=HALF_TOPIC,
            queue_id=0,
            properties=props,
            sys_flag=msg.sys_flag & ~TRANSACTION_TYPE_MASK,
        )
        return self.store.put(half, defer_sync=defer_sync)

    def rejects_late_end(self, half: StoredMessage, from_check: bool) -> bool:
        """5.x ``EndTransactionProcessor.rejectCommitOrRollback``: a send-phase commit/rollback of a
        message with ``CHECK_IMMUNITY_TIME_IN_SECONDS`` that arrives after that immunity (at least
        ``transactionTimeOut``) is refused (ILLEGAL_OPERATION, "wait check"); the check decides."""
        if not self.five or from_check:
            return False
        raw = half.properties.get(PROPERTY_CHECK_IMMUNITY)
        if not raw:
            return False
        timeout = self.broker.config.transaction_timeout_ms
        immunity = max(int_or(raw, 0) * 1000, timeout)  # TransactionalMessageUtil.getImmunityTime
        return self.clock.now() - half.born_timestamp > immunity

    def log_late_end(self, thread: str, state: int, msg_id: str, clo: int) -> None:
        what = "commit" if state == COMMIT else "rollback"
        self.tx.warn(
            thread,
            f"Message {what} fail [producer end]. currentTimeMillis - bornTime > checkImmunityTime, "
            f"msgId={msg_id},commitLogOffset={clo}, wait check",
        )

    def commit(self, half: StoredMessage) -> tuple[StoredMessage, StoredMessage | None]:
        """Store the message in its real topic and the op record, with one write: (real, op).

        As a 5.x broker with op batching the op record only joins the batch: (real, None)."""
        props = dict(half.properties)
        topic = props.pop(PROPERTY_REAL_TOPIC, half.topic)
        try:
            queue_id = int(props.pop(PROPERTY_REAL_QID, "0"))
        except ValueError:
            queue_id = 0
        props.pop(PROPERTY_CHECK_TIMES, None)
        props.pop(PROPERTY_TRANSACTION_ID, None)
        real = clone(
            half,
            topic=topic,
            queue_id=queue_id,
            properties=props,
            sys_flag=(half.sys_flag & ~TRANSACTION_TYPE_MASK) | TRANSACTION_COMMIT_TYPE,
            prepared_transaction_offset=half.commit_log_offset,
        )
        for fn in self.broker.put_filters:
            real = fn(real)
        if self.batching:
            stored_real = self.store.put(real, defer_sync=True)
            self.broker.request_sync()
            self.ops.add(half.queue_offset)
            return stored_real, None
        # nobody waits for END_TRANSACTION: flush it with the next group commit instead of inline
        stored_real, stored_op = self.store.put_many(
            [real, self.op_message(self.op_body(half.queue_offset))], defer_sync=True
        )
        self.broker.request_sync()
        self.resolved.add(half.queue_offset)
        return stored_real, stored_op

    def write_op(self, half: StoredMessage) -> StoredMessage | None:
        """The op record of a rollback: written now (4.9.8), or added to the 5.x batch (None)."""
        if self.batching:
            self.ops.add(half.queue_offset)
            return None
        stored = self.store.put(self.op_message(self.op_body(half.queue_offset)), defer_sync=True)
        self.broker.request_sync()
        self.resolved.add(half.queue_offset)
        return stored

    def op_body(self, offset: int) -> str:
        """The op record's text for one half offset (a 5.x batch concatenates them)."""
        # 4.9.8 writes the bare offset; 5.x "<offset>," (several per op message once batched)
        return f"{offset}{OFFSET_SEPARATOR}" if self.five else str(offset)

    def op_message(self, body: str) -> StoredMessage:
        """The op message that resolves the half offsets ``body`` names."""
        return StoredMessage(
            topic=OP_HALF_TOPIC,
            queue_id=0,
            body=body.encode(),
            properties={PROPERTY_TAGS: OP_TAG},
            born_timestamp=self.clock.now(),
            born_host=self.broker.broker_addr,
        )


def install(broker: Broker) -> TransactionService:
    service = TransactionService(broker)
    processor = EndTransactionProcessor(service)

    async def end_transaction(cmd: RemotingCommand, conn: Connection) -> None:
        # librocketmq does not wait for an answer (though its frame lacks the oneway flag) and Java
        # never sends one: answering would only cost a syscall per transaction
        await processor.handle(cmd, conn)

    broker.register(END_TRANSACTION, end_transaction, inline=True)
    return service
