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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import Generator
from typing import TYPE_CHECKING, Literal

from .client_service import learn_producer_from_request
from .codec import CHECK_TRANSACTION_STATE, END_TRANSACTION, RemotingCommand
from .message_codec import (
    PROPERTY_CHECK_IMMUNITY,
    PROPERTY_CHECK_TIMES,
    PROPERTY_PGROUP,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_REAL_QID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_UNIQ_KEY,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    StoredMessage,
    clone,
    encode_message,
    encoded_size,
)
from .store import NotWritableError
from .topics import CHECK_MAX_TIME_TOPIC, HALF_TOPIC, OP_HALF_TOPIC, PERM_READ, PERM_WRITE
from .transport import Connection
from .txlog import ThreadNames

if TYPE_CHECKING:
    from .broker import Broker

SYSTEM_GROUP = "CID_RMQ_SYS_TRANS"
CHECK_THREAD = "TransactionalMessageCheckService"
CHECK_SEND_THREAD = "Transaction-msg-check-thread"
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0
OP_TAG = "d"
#: 5.x ``TransactionalMessageUtil.OFFSET_SEPARATOR``: one op message lists several half offsets
OFFSET_SEPARATOR = ","
#: 5.x ``TransactionalMessageServiceImpl.SLEEP_WHILE_NO_OP`` (ms)
SLEEP_WHILE_NO_OP_MS = 1000
OP_BATCH_THREAD = "TransactionalOpBatchService"
#: ``ReputMessageService`` (4.9.8 and 5.3.3) sleeps 1 ms between dispatch rounds: a message put into
#: the half queue becomes readable there (its consume-queue entry) up to this long after the put
REPUT_INTERVAL_S = 0.001


def java_bool(raw: str | None) -> bool:
    """``Boolean.parseBoolean``: true only for "true" (any case). CPP's "1" is false."""
    return (raw or "").strip().lower() == "true"


def java_date(ms: int) -> str:
    return time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(ms / 1000))


def end_transaction_header(
    log_format: int,
    group: str,
    tsto: int,
    clo: int,
    state: int,
    from_check: bool,
    msg_id: str,
    tx_id: str,
) -> str:
    """``EndTransactionRequestHeader.toString()`` as the broker of ``log_format`` logs it.

    4 (4.9.5+): strings quoted, ``bname`` last; 5 (5.0+, Guava ``toStringHelper``): nothing quoted, no
    ``bname``. The field order is the same, and a missing string prints as ``null`` in both.
    """
    ftc = "true" if from_check else "false"
    if log_format == 5:
        return (
            f"EndTransactionRequestHeader{{producerGroup={group}, tranStateTableOffset={tsto}, "
            f"commitLogOffset={clo}, commitOrRollback={state}, fromTransactionCheck={ftc}, "
            f"msgId={msg_id}, transactionId={tx_id}}}"
        )
    return (
        f"EndTransactionRequestHeader{{producerGroup='{group}', tranStateTableOffset={tsto}, "
        f"commitLogOffset={clo}, commitOrRollback={state}, fromTransactionCheck={ftc}, "
        f"msgId='{msg_id}', transactionId='{tx_id}', bname='null'}}"
    )


def describe_message(msg: StoredMessage) -> str:
    """Java's ``MessageExt.toString()`` (as in the discard and op-write log lines)."""
    props = ", ".join(f"{k}={v}" for k, v in msg.properties.items())
    body = ", ".join(str(b - 256 if b > 127 else b) for b in msg.body)
    return (
        f"MessageExt [brokerName=null, queueId={msg.queue_id}, storeSize={encoded_size(msg)}, "
        f"queueOffset={msg.queue_offset}, sysFlag={msg.sys_flag}, bornTimestamp={msg.born_timestamp}, "
        f"bornHost=/{msg.born_host}, storeTimestamp={msg.store_timestamp}, storeHost=/{msg.store_host}, "
        f"msgId={msg.msg_id}, commitLogOffset={msg.commit_log_offset}, "
        f"bodyCRC={zlib.crc32(msg.body) & 0x7FFFFFFF}, reconsumeTimes={msg.reconsume_times}, "
        f"preparedTransactionOffset={msg.prepared_transaction_offset}, toString()=Message{{topic='{msg.topic}', "
        f"flag={msg.flag}, properties={{{props}}}, body=[{body}], transactionId='null'}}]"
    )


class TransactionService:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.tx = broker.logs.transaction
        self.resolved: set[int] = set()  # half-queue offsets with an op record
        self.passed: set[int] = set()  # half-queue offsets re-put as a newer copy or discarded
        self.cursor = 0
        self.op_cursor = 0
        self._task: asyncio.Task[None] | None = None
        self._end_threads = ThreadNames("EndTransactionThread_", 12)
        #: 5.x op batching (``MessageQueueOpContext`` of half queue 0): pending "<offset>," entries
        self.pending_ops: list[str] = []
        self.pending_size = 0
        #: ``MessageQueueOpContext.lastWriteTimestamp``: None until the first op (Java creates the context,
        #: stamped "now", at the first commit/rollback - so the first batch after a start waits 3-6 s)
        self.last_op_write_ms: int | None = None
        self._op_wakeup = asyncio.Event()
        self._op_task: asyncio.Task[None] | None = None
        self._put_now: dict[int, float] = {}
        #: the broker's clock (:mod:`.clock`): timeout, immunity, op batches and the check interval
        self.clock = broker.clock
        #: ``ServiceThread.wakeup()`` of the check service: the next pass runs at once (``check_now``)
        self._check_wakeup = asyncio.Event()
        #: check passes finished since the start, and whether one is running now
        self.passes_done = 0
        self.in_pass = False
        #: check-backs sent so far (all passes)
        self.checks_sent = 0
        #: half messages moved to ``TRANS_CHECK_MAX_TIME_TOPIC`` since the start
        self.discards = 0
        #: manual clock only: check-backs sent and not answered yet, commit-log offset of the copy ->
        #: its transaction id (so ``advance`` can return once they are answered)
        self.awaiting: dict[int, str] = {}
        #: how long (wall seconds) a settle waits for those answers; then they are reported unanswered
        self.answer_timeout = 10.0
        #: transaction ids of check-backs that went unanswered within ``answer_timeout``
        self.unanswered: list[str] = []
        if self.clock.manual:
            hooks = getattr(self.clock, "settle_hooks", None)
            if hooks is not None:
                hooks.append(self._wait_for_answers)
        self.recover()

    @property
    def five(self) -> bool:
        """Behaves as a 5.3.3 broker (``broker_version``)."""
        return self.broker.config.broker_version == "5.3.3"

    @property
    def batching(self) -> bool:
        """Op records go through the 5.x batch (5.3.3 with a positive batch interval)."""
        return self.five and self.broker.config.op_batch_interval_ms > 0

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

    # -- end transaction ------------------------------------------------------------------------
    async def end_transaction(self, cmd: RemotingCommand, conn: Connection) -> None:
        thread = self._end_threads.next()
        group = cmd.ext("producerGroup")
        try:
            state = cmd.ext_int("commitOrRollback")
            tsto = cmd.ext_int("tranStateTableOffset")
            clo = cmd.ext_int("commitLogOffset")
        except ValueError as exc:
            self.broker.logs.broker.warn(
                thread, f"invalid END_TRANSACTION from {conn.remote_addr}: {exc}"
            )
            return None
        self.note_answer(clo, cmd.ext_fields.get("transactionId"))
        from_check = java_bool(cmd.ext_fields.get("fromTransactionCheck"))
        header = end_transaction_header(
            self.broker.config.tx_log_format,
            group,
            tsto,
            clo,
            state,
            from_check,
            cmd.ext_fields.get("msgId", "null"),
            cmd.ext_fields.get("transactionId", "null"),
        )
        remark = "null" if cmd.remark is None else cmd.remark
        tx = self.tx
        debug = tx.enabled("DEBUG")
        if debug:
            tx.debug(thread, f"Transaction request:{header}")
        learn_producer_from_request(self.broker, group, conn, lambda: thread)
        addr = conn.remote_addr
        if not self._log_answer(thread, state, from_check, addr, header, remark):
            return None
        half = self._half_to_end(thread, cmd, group, tsto, clo, state, from_check, header, addr)
        if half is not None:
            self._apply_end(thread, half, state, header, debug)
        return None

    def _log_answer(
        self, thread: str, state: int, from_check: bool, addr: str, header: str, remark: str
    ) -> bool:
        """The transaction log's line for the producer's answer, as the real broker writes it;
        False when the request ends here (UNKNOW changes nothing; an unknown state is ignored)."""
        tx = self.tx
        if state == UNKNOWN:
            if from_check:
                tx.warn(
                    thread,
                    f"Check producer[{addr}] transaction state, but it's pending status.RequestHeader: {header} Remark: {remark}",
                )
            else:
                tx.warn(
                    thread,
                    f"The producer[{addr}] end transaction in sending message,  and it's pending status.RequestHeader: {header} Remark: {remark}",
                )
            return False
        if state == ROLLBACK:
            if from_check:
                tx.warn(
                    thread,
                    f"Check producer[{addr}] transaction state, the producer rollback the message.RequestHeader: {header} Remark: {remark}",
                )
            else:
                tx.warn(
                    thread,
                    f"The producer[{addr}] end transaction in sending message, rollback the message.RequestHeader: {header} Remark: {remark}",
                )
        elif state == COMMIT:
            if from_check:
                tx.warn(
                    thread,
                    f"Check producer[{addr}] transaction state, the producer commit the message.RequestHeader: {header} Remark: {remark}",
                )
        else:
            self.broker.logs.broker.warn(
                thread, f"END_TRANSACTION with unknown commitOrRollback={state} ignored: {header}"
            )
            return False
        return True

    def _half_to_end(
        self,
        thread: str,
        cmd: RemotingCommand,
        group: str | None,
        tsto: int,
        clo: int,
        state: int,
        from_check: bool,
        header: str,
        addr: str,
    ) -> StoredMessage | None:
        """The half message the request ends, or None (logged) when the broker refuses it: a
        late send-phase answer (5.x immunity), or a request that names no half message of its
        group at that offset."""
        half = self.store.lookup(clo)
        if (
            half is not None
            and half.topic == HALF_TOPIC
            and self.rejects_late_end(half, from_check)
        ):
            self.log_late_end(thread, state, cmd.ext_fields.get("msgId", "null"), clo)
            return None
        problem = None
        if half is None or half.topic != HALF_TOPIC:
            problem = "Find prepared transaction message failed"
        elif half.queue_offset != tsto:
            problem = "The transaction state table offset wrong"
        elif half.properties.get(PROPERTY_PGROUP, "") != group:
            problem = "The producer group wrong"
        if problem is not None or half is None:
            self.broker.logs.broker.warn(thread, f"{problem}, request from {addr}: {header}")
            return None
        return half

    def _apply_end(
        self, thread: str, half: StoredMessage, state: int, header: str, debug: bool
    ) -> None:
        """Commit (the real message and the op record) or roll back (the op record only)."""
        try:
            if state == COMMIT:
                _real, op = self.commit(half)
            else:
                op = self.write_op(half)
        except NotWritableError as exc:  # full disk: the half stays and is checked back later
            self.broker.logs.broker.warn(
                thread,
                f"END_TRANSACTION not applied, the store is not writable ({exc}); the half "
                f"message stays and will be checked back: {header}",
            )
            return
        if debug and op is not None:
            self.tx.debug(
                thread,
                f"Transaction op message write successfully. messageId={op.msg_id}, queueId={op.queue_id} "
                f"msgExt:{describe_message(half)}",
            )

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
        immunity = max(_int(raw, 0) * 1000, timeout)  # TransactionalMessageUtil.getImmunityTime
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
            self._add_to_batch(half.queue_offset)
            return stored_real, None
        # nobody waits for END_TRANSACTION: flush it with the next group commit instead of inline
        stored_real, stored_op = self.store.put_many(
            [real, self._op_message(self._op_body(half.queue_offset))], defer_sync=True
        )
        self.broker.request_sync()
        self.resolved.add(half.queue_offset)
        return stored_real, stored_op

    def write_op(self, half: StoredMessage) -> StoredMessage | None:
        """The op record of a rollback: written now (4.9.8), or added to the 5.x batch (None)."""
        if self.batching:
            self._add_to_batch(half.queue_offset)
            return None
        stored = self.store.put(self._op_message(self._op_body(half.queue_offset)), defer_sync=True)
        self.broker.request_sync()
        self.resolved.add(half.queue_offset)
        return stored

    def _op_body(self, offset: int) -> str:
        # 4.9.8 writes the bare offset; 5.x "<offset>," (several per op message once batched)
        return f"{offset}{OFFSET_SEPARATOR}" if self.five else str(offset)

    def _op_message(self, body: str) -> StoredMessage:
        return StoredMessage(
            topic=OP_HALF_TOPIC,
            queue_id=0,
            body=body.encode(),
            properties={PROPERTY_TAGS: OP_TAG},
            born_timestamp=self.clock.now(),
            born_host=self.broker.broker_addr,
        )

    # -- 5.x op batching (TransactionalMessageServiceImpl.deletePrepareMessage / batchSendOpMessage) --
    def _add_to_batch(self, offset: int) -> None:
        data = self._op_body(offset)
        if self.last_op_write_ms is None:
            self.last_op_write_ms = self.clock.now()
        self.pending_ops.append(data)
        self.pending_size += len(data)
        if self.pending_size > self.broker.config.transaction_op_msg_max_size:
            self._op_wakeup.set()

    def flush_op_batch(self, *, now: int | None = None) -> int:
        """One ``batchSendOpMessage``: write the pending batch if it is due; return the next wake-up
        time in ms (0 = at once: more than one op message's worth is still pending)."""
        cfg = self.broker.config
        start = self.clock.now() if now is None else now
        interval = cfg.op_batch_interval_ms
        max_size = cfg.transaction_op_msg_max_size
        last = self.last_op_write_ms
        if (
            not self.pending_ops
            or last is None
            or (self.pending_size < max_size and start - last < interval)
        ):
            return start + interval
        parts: list[str] = []
        length = 0
        while self.pending_ops and length < max_size:  # getOpMessage: up to ~maxSize characters
            data = self.pending_ops.pop(0)
            parts.append(data)
            length += len(data)
        self.pending_size -= length
        body = "".join(parts)
        self.last_op_write_ms = self.clock.now()  # getOpMessage stamps it after polling the batch
        try:
            self.store.put(self._op_message(body), defer_sync=True)
        except NotWritableError as exc:
            # Java logs and drops the batch: its halves get checked back
            self.tx.error(
                OP_BATCH_THREAD,
                f"Transaction batch op message write failed. body is {body}, queueId is 0 ({exc})",
            )
            return 0 if self.pending_size >= max_size else start + interval
        self.broker.request_sync()
        self.resolved.update(op_offsets(body.encode()))
        self.tx.debug(OP_BATCH_THREAD, "Send op message queueIds=[0]")
        return 0 if self.pending_size >= max_size else start + interval

    async def _op_batch_loop(self) -> None:
        """``TransactionalOpBatchService.run``: sleep until the wake-up time (or an oversize batch)."""
        self.tx.info(OP_BATCH_THREAD, "Start transaction op batch thread!")
        wake = self.clock.now() + self.broker.config.op_batch_interval_ms
        while True:
            delay = wake - self.clock.now()
            if delay > 0:
                await self.clock.wait(self._op_wakeup, delay / 1000)
            self._op_wakeup.clear()
            try:
                wake = self.flush_op_batch()
            except Exception as exc:  # noqa: BLE001 - "batchSendOp error.", the thread goes on
                self.tx.error(OP_BATCH_THREAD, f"batchSendOp error. {exc!r}")
                wake = 0

    # -- check loop -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.batching:
            self._op_task = self.broker.spawn(self._op_batch_loop())
        self.tx.info(CHECK_THREAD, "Start transaction check service thread!")
        self._task = self.broker.spawn(self._loop())

    async def stop(self) -> None:
        if self._op_task is not None:
            self._op_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._op_task
            self._op_task = None
            # ServiceThread.shutdown wakes the thread for one last batchSendOpMessage: due ops only
            with contextlib.suppress(Exception):
                self.flush_op_batch()
            self.tx.info(OP_BATCH_THREAD, "End transaction op batch thread!")
        if self._task is not None:
            self._task.cancel()
            # the loop logs its own failures; stopping only waits for it to end
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        """``TransactionalMessageCheckService.run``: ``waitForRunning(interval)``, then one pass; a
        ``wakeup()`` (:meth:`check_now`) ends the wait early, as Java's ``ServiceThread`` does."""
        interval = self.broker.config.check_every_ms / 1000
        while True:
            await self.clock.wait(self._check_wakeup, interval)
            self._check_wakeup.clear()
            self.in_pass = True
            try:
                await self.check_pass()
            except Exception as exc:  # noqa: BLE001 - keep checking next interval, like the Java thread
                self.tx.error(CHECK_THREAD, f"Check error: {exc!r}")
            finally:
                self.in_pass = False
                self.passes_done += 1

    def wake_check(self) -> int:
        """Start the next check pass now (the wait for the interval ends); returns the number of
        passes finished before it, so a caller can wait for ``passes_done`` to pass it."""
        before = self.passes_done + (1 if self.in_pass else 0)
        self._check_wakeup.set()
        return before

    # -- check-back answers (manual clock) ----------------------------------------------------------
    def note_answer(self, clo: int | None, transaction_id: str | None) -> None:
        """An END_TRANSACTION (remoting or gRPC) for a copy or transaction a check-back named."""
        if not self.awaiting:
            return
        if clo is not None and self.awaiting.pop(clo, None) is not None:
            return
        if transaction_id:
            for key, tx_id in list(self.awaiting.items()):
                if tx_id == transaction_id:
                    del self.awaiting[key]

    async def _wait_for_answers(self) -> bool:
        """Settle hook of the manual clock: wait (wall time, ``answer_timeout``) until every
        check-back sent has been answered; the ones that were not are listed in ``unanswered``.
        Returns whether there was anything to wait for."""
        if not self.awaiting:
            return False
        deadline = time.monotonic() + self.answer_timeout
        while self.awaiting and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
        if self.awaiting:
            self.unanswered.extend(self.awaiting.values())
            self.awaiting.clear()
        return True

    def _queue_name(self, topic: str) -> str:
        return f"MessageQueue [topic={topic}, brokerName={self.broker.broker_name}, queueId=0]"

    def check_once(self) -> int:
        """One scan of the half queue without the 5.x pause; returns the number of checks sent."""
        scan = self._scan()
        try:
            while next(scan):
                pass
        except StopIteration as done:
            return int(done.value)
        return 0  # pragma: no cover - the generator always ends with StopIteration

    async def check_pass(self) -> int:
        """One scan as the check service runs it: as 5.x, with its 1 s pause (``SLEEP_WHILE_NO_OP``)."""
        scan = self._scan()
        try:
            while True:
                if next(scan):
                    await self.clock.sleep(SLEEP_WHILE_NO_OP_MS / 1000)
        except StopIteration as done:
            return int(done.value)

    def _scan(self) -> Generator[bool, None, int]:
        """The scan; yields True where a 5.x broker sleeps 1 s before its first check-back of a pass.

        5.x ``check``: op records were read (``opMsg != null``) and none named the half message, so it
        pulls more; none come (NO_NEW_MSG) and it sleeps ``SLEEP_WHILE_NO_OP`` before checking back.  The
        op records seen are those read when the scan began (Java pulls them before the sleep); ops
        written during the sleep count from the next pass."""
        cfg = self.broker.config
        tx = self.tx
        begin = self.clock.now()
        ops_read, resolved = self._begin_pass(begin)
        debug = tx.enabled("DEBUG")
        sent = 0
        i = self.cursor
        #: half-queue offsets this pass re-put -> when (perf_counter): not readable for REPUT_INTERVAL_S
        self._put_now = {}
        # like Java, read on past the offset the pass began at: the copies this pass re-puts come
        # next once dispatched (those below the maximum stop it as "Fresh stored", those at it are
        # discarded); one not dispatched yet ends the pass as Java's NO_NEW_MSG does
        while True:
            if self.clock.now() - begin > cfg.max_process_time_ms:
                # Java's MAX_PROCESS_TIME_LIMIT: one pass over a queue stops after 60 s and the
                # next pass goes on from here (4.9.8 and 5.3.3)
                tx.info(
                    CHECK_THREAD,
                    f"Queue={self._queue_name(HALF_TOPIC)} process time reach max="
                    f"{cfg.max_process_time_ms}",
                )
                break
            if i in resolved or i in self.passed:
                if debug and i in resolved:
                    tx.debug(CHECK_THREAD, f"Half offset {i} has been committed/rolled back")
                i += 1
                continue
            msg = self._readable(i)
            if msg is None:
                break
            verdict = self._verdict(i, msg, begin, resolved)
            if verdict == "stop":
                break
            if verdict == "check":
                if ops_read:  # once per pass: afterwards opMsg is null (NO_NEW_MSG)
                    ops_read = False
                    yield True
                self._check_back(i, msg)
                sent += 1
            self.passed.add(i)
            i += 1
        self._end_pass(i, sent, begin)
        return sent

    def _begin_pass(self, begin: int) -> tuple[bool, set[int]]:
        """The lines a pass begins with; moves the op cursor to the op queue's end.  Returns
        whether op records were read (5.x's ``opMsg != null``) and the half offsets they
        resolved (Java's removeMap)."""
        tx = self.tx
        store = self.store
        tx.info(CHECK_THREAD, f"Begin to check prepare message, begin time:{begin}")
        tx.debug(CHECK_THREAD, f"Check topic={HALF_TOPIC}, queues=[{self._queue_name(HALF_TOPIC)}]")
        half_max = store.max_offset(HALF_TOPIC, 0)
        op_max = store.max_offset(OP_HALF_TOPIC, 0)
        tx.info(
            CHECK_THREAD,
            f"Before check, the queue={self._queue_name(HALF_TOPIC)} msgOffset={self.cursor} opOffset={self.op_cursor}",
        )
        if self.op_cursor >= op_max:
            status = "NO_MESSAGE_IN_QUEUE" if op_max == 0 else "OFFSET_OVERFLOW_ONE"
            tx.warn(
                CHECK_THREAD,
                f"No new message. GetMessageStatus={status}, topic={OP_HALF_TOPIC}, groupId={SYSTEM_GROUP}, requestOffset={self.op_cursor}",
            )
            tx.warn(
                CHECK_THREAD,
                f"The miss op offset={self.op_cursor} in queue={self._queue_name(OP_HALF_TOPIC)} is NO_NEW_MSG, "
                f"pullResult=PullResult [pullStatus=NO_NEW_MSG, nextBeginOffset={self.op_cursor}, minOffset=0, "
                f"maxOffset={op_max}, msgFoundList=0]",
            )
        elif tx.enabled("DEBUG"):
            for op in store.get(OP_HALF_TOPIC, 0, self.op_cursor, op_max - self.op_cursor):
                tx.debug(
                    CHECK_THREAD,
                    f"Topic: {OP_HALF_TOPIC} tags: {OP_TAG}, OpOffset: {op.queue_offset}, "
                    f"HalfOffset: {op.body.decode(errors='replace')}",
                )
        # 5.x reads op records from the oldest one not yet done: any op naming a half at or after the
        # cursor, or written since the last pass, makes opMsg non-null
        ops_read = self.five and (op_max > self.op_cursor or bool(self.resolved))
        resolved = set(self.resolved)  # the op records this pass has read (Java's removeMap)
        self.op_cursor = op_max
        if self.cursor >= half_max:
            status = "NO_MESSAGE_IN_QUEUE" if half_max == 0 else "OFFSET_OVERFLOW_ONE"
            tx.warn(
                CHECK_THREAD,
                f"No new message. GetMessageStatus={status}, topic={HALF_TOPIC}, groupId={SYSTEM_GROUP}, requestOffset={self.cursor}",
            )
        return ops_read, resolved

    def _readable(self, i: int) -> StoredMessage | None:
        """The half message at offset ``i``, or None where the pass stops: nothing there yet, or
        a copy this pass re-put that is not readable yet."""
        put_at = self._put_now.get(i)
        if put_at is not None and time.perf_counter() - put_at < REPUT_INTERVAL_S:
            self.tx.warn(  # the store's line for a read past the dispatched end (real 4.9.8's)
                CHECK_THREAD,
                f"No new message. GetMessageStatus=OFFSET_OVERFLOW_ONE, topic={HALF_TOPIC}, "
                f"groupId={SYSTEM_GROUP}, requestOffset={i}",
            )
            return None
        found = self.store.get(HALF_TOPIC, 0, i, 1)
        return found[0] if found else None

    def _verdict(
        self, i: int, msg: StoredMessage, begin: int, resolved: set[int]
    ) -> Literal["next", "stop", "check"]:
        """What the pass does with half message ``msg`` at offset ``i``: ``next`` (discarded, or
        immune for now: passed), ``stop`` (too fresh: the pass ends here) or ``check`` it back."""
        cfg = self.broker.config
        tx = self.tx
        # needDiscard comes before the "Fresh stored" break (4.9.8 and 5.3.3): the copy re-put for
        # the last check-back earlier in this same pass is discarded at once, before its answer
        # arrives; a COMMIT answer then still commits that copy (committed *and* discarded)
        checks = _int(msg.properties.get(PROPERTY_CHECK_TIMES), 0)
        if checks >= cfg.check_max:
            self.discard(msg)
            return "next"
        if self._past_reserved_time(msg):
            # Java's needDiscard has raised the count in memory before needSkip is asked,
            # so the discarded copy carries it (absent = 1, as for a check-back)
            props = dict(msg.properties)
            props[PROPERTY_CHECK_TIMES] = str(checks + 1)
            self.discard(clone(msg, properties=props))
            return "next"
        if msg.store_timestamp >= begin:
            tx.debug(
                CHECK_THREAD,
                f"Fresh stored. the miss offset={i}, check it later, store={java_date(msg.store_timestamp)}",
            )
            return "stop"
        immunity_raw = msg.properties.get(PROPERTY_CHECK_IMMUNITY)
        immunity = _int(immunity_raw, -1) * 1000 if immunity_raw is not None else -1
        if immunity < 0:
            immunity = cfg.transaction_timeout_ms
        age = self.clock.now() - msg.born_timestamp
        if immunity_raw is not None:
            if age < immunity:
                self._immune(msg, checks + 1, resolved, immunity_raw)
                return "next"
        elif 0 <= age < immunity:
            tx.debug(
                CHECK_THREAD,
                f"New arrived, the miss offset={i}, check it later checkImmunity={immunity}, "
                f"born={java_date(msg.born_timestamp)}",
            )
            return "stop"
        return "check"

    def _check_back(self, i: int, msg: StoredMessage) -> None:
        """Put a copy of ``msg`` (offset ``i``) back with its check count raised, and ask its
        producer group about it."""
        tx = self.tx
        props = dict(msg.properties)
        props[PROPERTY_CHECK_TIMES] = str(_int(msg.properties.get(PROPERTY_CHECK_TIMES), 0) + 1)
        copy = self.store.put(clone(msg, properties=props))
        self._put_now[copy.queue_offset] = time.perf_counter()
        tx.debug(CHECK_THREAD, f"[BUG-TO-FIX] Thread:{CHECK_THREAD} msgID:{msg.msg_id}")
        tx.debug(
            CHECK_THREAD,
            f"Send check message, the offset={i} restored in queueOffset={copy.queue_offset} "
            f"commitLogOffset={copy.commit_log_offset} newMsgId={copy.msg_id} "
            f"realMsgId={copy.uniq_key} topic={HALF_TOPIC}",
        )
        self.send_check(copy)

    def _end_pass(self, i: int, sent: int, begin: int) -> None:
        """Where the pass got: the cursors and their committed offsets, and the closing lines."""
        store = self.store
        self.cursor = i
        self.resolved = {o for o in self.resolved if o >= self.cursor}
        self.passed = {o for o in self.passed if o >= self.cursor}
        store.commit_offset(SYSTEM_GROUP, HALF_TOPIC, 0, self.cursor)
        store.commit_offset(SYSTEM_GROUP, OP_HALF_TOPIC, 0, self.op_cursor)
        if self.five:
            self._after_check(sent)
        self.tx.info(
            CHECK_THREAD, f"End to check prepare message, consumed time:{self.clock.now() - begin}"
        )

    def _after_check(self, put_back: int) -> None:
        """5.3.3's INFO line after a pass over the half queue (``TransactionalMessageServiceImpl``):
        where the pass got. Its ``msgOffset`` moves one per half message and one per half message
        put back for a check-back, which is how the health job counts the transactions a 5.x broker
        took in (docs/rocketmq-facts.md); 4.9.8 does not write it."""
        store = self.store
        head = store.get(HALF_TOPIC, 0, self.cursor, 1)
        msg_time = head[0].store_timestamp if head else self.clock.now()
        self.tx.info(
            CHECK_THREAD,
            f"After check, {self._queue_name(HALF_TOPIC)} opOffset={self.op_cursor} "
            f"opOffsetDiff={store.max_offset(OP_HALF_TOPIC, 0) - self.op_cursor} "
            f"msgOffset={self.cursor} msgOffsetDiff={store.max_offset(HALF_TOPIC, 0) - self.cursor} "
            f"msgTime={java_date(msg_time)} msgTimeDelayInMs={self.clock.now() - msg_time} "
            f"putInQueueCount={put_back}",
        )

    def _past_reserved_time(self, msg: StoredMessage) -> bool:
        """Java ``needSkip`` (4.9.8 and 5.3.3): a half message born more than ``fileReservedTime``
        hours ago is discarded like one checked too often, without a check-back (its files may
        be deleted any time now).  Asked only for a message not discarded for its check count,
        as Java's ``needDiscard(...) || needSkip(...)`` does."""
        limit = self.broker.config.file_reserved_time * 3_600_000
        if self.clock.now() - msg.born_timestamp <= limit:
            return False
        self.tx.info(
            CHECK_THREAD,
            f"Half message exceed file reserved time ,so skip it.messageId {msg.msg_id},bornTime "
            f"{msg.born_timestamp}",
        )
        return True

    def _immune(
        self, msg: StoredMessage, times: int, resolved: set[int], immunity_raw: str
    ) -> None:
        """A half message still inside its CHECK_IMMUNITY_TIME_IN_SECONDS (Java ``checkPrepareQueueOffset``,
        4.9.8 and 5.3.3): done if an op names its first offset (``TRAN_PREPARED_QUEUE_OFFSET``), else
        re-put as a new copy that remembers that offset.  The copy carries ``TRANSACTION_CHECK_TIMES``
        already raised by ``needDiscard``, so every pass inside the immunity uses up one of
        ``transactionCheckMax`` without a check (apache/rocketmq#8311): an immunity longer than
        ``transactionCheckMax`` x ``transactionCheckInterval`` is discarded without any check-back."""
        first = msg.properties.get(PROPERTY_PREPARED_QUEUE_OFFSET)
        if first is not None and _int(first, -1) in resolved:
            if self.five:
                self.tx.info(
                    CHECK_THREAD,
                    f"removeMap contain prepareQueueOffset. real_topic="
                    f"{msg.properties.get(PROPERTY_REAL_TOPIC, '')},uniqKey={msg.uniq_key},"
                    f"immunityTime={immunity_raw},offset={msg.queue_offset}",
                )
            return
        props = dict(msg.properties)
        props[PROPERTY_CHECK_TIMES] = str(times)
        props[PROPERTY_PREPARED_QUEUE_OFFSET] = (
            first if first is not None else str(msg.queue_offset)
        )
        copy = self.store.put(clone(msg, properties=props))
        self._put_now[copy.queue_offset] = time.perf_counter()

    def send_check(self, msg: StoredMessage) -> bool:
        group = msg.properties.get(PROPERTY_PGROUP, "")
        conn = self.broker.clients.next_producer_channel(group)
        if conn is None:
            self.tx.warn(
                CHECK_SEND_THREAD, f"Check transaction failed, channel is null. groupId={group}"
            )
            self.broker.logs.broker.warn(
                CHECK_SEND_THREAD,
                f"Check transaction failed, channel table is empty. groupId={group}",
            )
            return False
        push = getattr(conn, "push_transaction_check", None)
        if (
            push is not None
        ):  # a 5.x gRPC client (txmsg_broker.grpc): RecoverOrphanedTransactionCommand
            pushed = bool(push(msg))
            if pushed:
                self._sent(msg)
            return pushed
        real_topic = msg.properties.get(PROPERTY_REAL_TOPIC, msg.topic)
        real_qid = _int(msg.properties.get(PROPERTY_REAL_QID), msg.queue_id)
        body = encode_message(msg, topic=real_topic, queue_id=real_qid)
        uniq = msg.uniq_key
        ext = {
            "tranStateTableOffset": str(msg.queue_offset),
            "commitLogOffset": str(msg.commit_log_offset),
            "msgId": uniq,
            "transactionId": uniq,
            "offsetMsgId": msg.msg_id,
        }
        # 4.9 logs each check-back at DEBUG only; 5.1+ at INFO (countable at the default level)
        self.tx.log(
            "INFO" if self.broker.config.log_format == 5 else "DEBUG",
            CHECK_SEND_THREAD,
            f"Check transaction. real_topic={real_topic},uniqKey={uniq},offset={msg.queue_offset},"
            f"commitLogOffset={msg.commit_log_offset}",
        )
        if not conn.send_oneway(CHECK_TRANSACTION_STATE, ext, body):
            self.broker.logs.broker.error(
                CHECK_SEND_THREAD,
                f"Check transaction failed because invoke producer exception. group={group}, "
                f"msgId={msg.msg_id}, error=channel {conn.remote_addr} is closed",
            )
            return False
        self._sent(msg)
        return True

    def _sent(self, msg: StoredMessage) -> None:
        self.checks_sent += 1
        if self.clock.manual:  # only a manual clock's advance waits for answers
            self.awaiting[msg.commit_log_offset] = msg.uniq_key

    def discard(self, msg: StoredMessage) -> StoredMessage:
        """Move a half message to ``TRANS_CHECK_MAX_TIME_TOPIC`` as
        ``DefaultTransactionalMessageCheckListener.resolveDiscardMsg`` does (4.9.8 and 5.3.3).

        The copy keeps everything of the half message it was made from: body, flag, sys flag,
        born timestamp and host, reconsume times and every property, ``REAL_TOPIC``,
        ``REAL_QID``, ``PGROUP``, ``UNIQ_KEY`` and ``TRANSACTION_CHECK_TIMES`` included (so a
        rescuer can re-send it); it goes to queue 0 of the topic's single queue.  Nothing is
        written to the op queue: only the check cursor moves past the half message, and an
        END_TRANSACTION naming it still applies.  Verified field by field on real 4.9.8 and 5.3.3
        (docs/rocketmq-facts.md, "What a discard stores")."""
        self.discards += 1
        self.tx.error(
            CHECK_THREAD,
            f"MsgExt:{describe_message(msg)} has been checked too many times, so discard it by moving it "
            f"to system topic TRANS_CHECK_MAXTIME_TOPIC",
        )
        # Like Java (4.9.8 and 5.3.3, ``createTopicOfTranCheckMaxTime``): the topic exists from the
        # first discard on, one read/write queue, routed at once; a consumer subscribed before
        # that gets it at its next route refresh (librocketmq: 30 s).
        self.broker.topics.create_if_absent(CHECK_MAX_TIME_TOPIC, 1, PERM_READ | PERM_WRITE)
        stored = self.store.put(clone(msg, topic=CHECK_MAX_TIME_TOPIC, queue_id=0))
        self.tx.info(
            CHECK_THREAD,
            f"Put checked-too-many-time half message to TRANS_CHECK_MAXTIME_TOPIC OK. Restored in "
            f"queueOffset={msg.queue_offset}, commitLogOffset={msg.commit_log_offset}, "
            f"real topic={msg.properties.get(PROPERTY_REAL_TOPIC, '')}",
        )
        return stored


def op_offsets(body: bytes) -> list[int]:
    """Half-queue offsets named by an op record: 4.9.8 ``"12"``, 5.x ``"12,13,"``."""
    found = []
    for part in body.decode(errors="replace").split(OFFSET_SEPARATOR):
        part = part.strip()
        if part:
            try:
                found.append(int(part))
            except ValueError:
                continue
    return found


def _int(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw not in (None, "") else default
    except ValueError:
        return default


def install(broker: Broker) -> TransactionService:
    service = TransactionService(broker)

    async def end_transaction(cmd: RemotingCommand, conn: Connection) -> None:
        # librocketmq does not wait for an answer (though its frame lacks the oneway flag) and Java
        # never sends one: answering would only cost a syscall per transaction
        await service.end_transaction(cmd, conn)

    broker.register(END_TRANSACTION, end_transaction, inline=True)
    return service
