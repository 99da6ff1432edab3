"""The check service: ``TransactionalMessageCheckService`` and the pass it runs over the half queue.

Every ``check_interval_ms`` (or at once after :meth:`CheckService.wake_check`) one pass reads the half
queue from the service's cursor: it skips entries an op record resolved, discards a message checked
``check_max`` times (or older than ``fileReservedTime``), re-puts one inside its immunity, stops at one
too fresh, and checks the rest back (a re-put copy with the count raised, then
:class:`.check_backs.CheckBacks`).  The pass owns the cursor's moves; the service owns the state that
END_TRANSACTION and the op batch also write (``resolved``), so both sides read one set of offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Literal

from .message_codec import (
    PROPERTY_CHECK_IMMUNITY,
    PROPERTY_CHECK_TIMES,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_REAL_TOPIC,
    StoredMessage,
    clone,
)
from .topics import CHECK_MAX_TIME_TOPIC, HALF_TOPIC, OP_HALF_TOPIC, PERM_READ, PERM_WRITE
from .transaction_formats import (
    CHECK_THREAD,
    OP_TAG,
    REPUT_INTERVAL_S,
    SLEEP_WHILE_NO_OP_MS,
    SYSTEM_GROUP,
    describe_message,
    int_or,
    java_date,
)

if TYPE_CHECKING:
    from .check_backs import CheckBacks
    from .transaction_service import TransactionService


class CheckService:
    """The check loop of one broker and its passes over the half queue."""

    def __init__(self, service: TransactionService, check_backs: CheckBacks) -> None:
        self.service = service
        self.check_backs = check_backs
        self.broker = service.broker
        self.store = service.store
        self.tx = service.tx
        #: the broker's clock (:mod:`.clock`): timeout, immunity and the check interval
        self.clock = service.clock
        self._task: asyncio.Task[None] | None = None
        #: half-queue offsets the current pass re-put -> when (perf_counter): not readable for
        #: REPUT_INTERVAL_S
        self._put_now: dict[int, float] = {}
        #: ``ServiceThread.wakeup()`` of the check service: the next pass runs at once (``check_now``)
        self._check_wakeup = asyncio.Event()
        #: check passes finished since the start, and whether one is running now
        self.passes_done = 0
        self.in_pass = False
        #: half messages moved to ``TRANS_CHECK_MAX_TIME_TOPIC`` since the start
        self.discards = 0

    def start(self) -> None:
        self.tx.info(CHECK_THREAD, "Start transaction check service thread!")
        self._task = self.broker.spawn(self._loop())

    async def stop(self) -> None:
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
        i = self.service.cursor
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
            if i in resolved or i in self.service.passed:
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
            self.service.passed.add(i)
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
            f"Before check, the queue={self._queue_name(HALF_TOPIC)} msgOffset={self.service.cursor} opOffset={self.service.op_cursor}",
        )
        if self.service.op_cursor >= op_max:
            status = "NO_MESSAGE_IN_QUEUE" if op_max == 0 else "OFFSET_OVERFLOW_ONE"
            tx.warn(
                CHECK_THREAD,
                f"No new message. GetMessageStatus={status}, topic={OP_HALF_TOPIC}, groupId={SYSTEM_GROUP}, requestOffset={self.service.op_cursor}",
            )
            tx.warn(
                CHECK_THREAD,
                f"The miss op offset={self.service.op_cursor} in queue={self._queue_name(OP_HALF_TOPIC)} is NO_NEW_MSG, "
                f"pullResult=PullResult [pullStatus=NO_NEW_MSG, nextBeginOffset={self.service.op_cursor}, minOffset=0, "
                f"maxOffset={op_max}, msgFoundList=0]",
            )
        elif tx.enabled("DEBUG"):
            for op in store.get(
                OP_HALF_TOPIC, 0, self.service.op_cursor, op_max - self.service.op_cursor
            ):
                tx.debug(
                    CHECK_THREAD,
                    f"Topic: {OP_HALF_TOPIC} tags: {OP_TAG}, OpOffset: {op.queue_offset}, "
                    f"HalfOffset: {op.body.decode(errors='replace')}",
                )
        # 5.x reads op records from the oldest one not yet done: any op naming a half at or after the
        # cursor, or written since the last pass, makes opMsg non-null
        ops_read = self.service.five and (
            op_max > self.service.op_cursor or bool(self.service.resolved)
        )
        resolved = set(
            self.service.resolved
        )  # the op records this pass has read (Java's removeMap)
        self.service.op_cursor = op_max
        if self.service.cursor >= half_max:
            status = "NO_MESSAGE_IN_QUEUE" if half_max == 0 else "OFFSET_OVERFLOW_ONE"
            tx.warn(
                CHECK_THREAD,
                f"No new message. GetMessageStatus={status}, topic={HALF_TOPIC}, groupId={SYSTEM_GROUP}, requestOffset={self.service.cursor}",
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
        checks = int_or(msg.properties.get(PROPERTY_CHECK_TIMES), 0)
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
        immunity = int_or(immunity_raw, -1) * 1000 if immunity_raw is not None else -1
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
        props[PROPERTY_CHECK_TIMES] = str(int_or(msg.properties.get(PROPERTY_CHECK_TIMES), 0) + 1)
        copy = self.store.put(clone(msg, properties=props))
        self._put_now[copy.queue_offset] = time.perf_counter()
        tx.debug(CHECK_THREAD, f"[BUG-TO-FIX] Thread:{CHECK_THREAD} msgID:{msg.msg_id}")
        tx.debug(
            CHECK_THREAD,
            f"Send check message, the offset={i} restored in queueOffset={copy.queue_offset} "
            f"commitLogOffset={copy.commit_log_offset} newMsgId={copy.msg_id} "
            f"realMsgId={copy.uniq_key} topic={HALF_TOPIC}",
        )
        self.check_backs.send(copy)

    def _end_pass(self, i: int, sent: int, begin: int) -> None:
        """Where the pass got: the cursors and their committed offsets, and the closing lines."""
        store = self.store
        self.service.cursor = i
        self.service.resolved = {o for o in self.service.resolved if o >= self.service.cursor}
        self.service.passed = {o for o in self.service.passed if o >= self.service.cursor}
        store.commit_offset(SYSTEM_GROUP, HALF_TOPIC, 0, self.service.cursor)
        store.commit_offset(SYSTEM_GROUP, OP_HALF_TOPIC, 0, self.service.op_cursor)
        if self.service.five:
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
        head = store.get(HALF_TOPIC, 0, self.service.cursor, 1)
        msg_time = head[0].store_timestamp if head else self.clock.now()
        self.tx.info(
            CHECK_THREAD,
            f"After check, {self._queue_name(HALF_TOPIC)} opOffset={self.service.op_cursor} "
            f"opOffsetDiff={store.max_offset(OP_HALF_TOPIC, 0) - self.service.op_cursor} "
            f"msgOffset={self.service.cursor} msgOffsetDiff={store.max_offset(HALF_TOPIC, 0) - self.service.cursor} "
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
        if first is not None and int_or(first, -1) in resolved:
            if self.service.five:
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
